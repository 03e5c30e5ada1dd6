//! MQTT through rumqttc: 3.1.1 and 5, QoS 0/1/2, several connections, TCP_NODELAY.
//!
//! Each publishing connection has a thread that drives rumqttc's event loop and counts
//! what it does (publishes written, acknowledgements, reconnections). A publish is handed
//! to the client with `try_publish`: when the request channel is full (the broker's
//! in-flight window is exhausted and the channel behind it filled up) the caller gets
//! [`SendError::Full`], waits and retries; nothing is dropped.
//!
//! When a connection breaks, rumqttc sets aside the QoS 1/2 publishes in flight (written,
//! not acknowledged) and the requests still queued, but drops all of them when the broker
//! answers the reconnection with a new session, which it always does for a clean session
//! and after a restart without persistence. The publishing thread therefore takes them
//! out at the break (`Keeper`) and hands them back after the reconnection, one at a time
//! and within the in-flight window: every message is written again until the broker
//! acknowledges it or the target closes, and the counts say which were retransmitted,
//! which requeued, and which were abandoned at close and why.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hoptrace_probe::carrier::{HEADER, envelope};
use rumqttc::v5::mqttbytes::v5::{
    ConnectReturnCode as ConnectReturnCode5, Packet as Packet5, PublishProperties,
    SubscribeReasonCode as SubscribeReasonCode5,
};
use rumqttc::{ConnectReturnCode, NetworkOptions, Outgoing as Out, Packet, QoS};

use super::{Meta, Outgoing, Received, SendError, Source, Target, TargetError, TargetStats};
use crate::url::{Carrier, MqttEndpoint, MqttVersion, join_host_port};

/// Largest packet accepted and sent (Mosquitto's test configuration allows 2 MiB).
const MAX_PACKET_BYTES: usize = 2 * 1024 * 1024;

fn qos_of(q: u8) -> QoS {
    match q {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

fn qos5_of(q: u8) -> rumqttc::v5::mqttbytes::QoS {
    use rumqttc::v5::mqttbytes::QoS as Q;
    match q {
        0 => Q::AtMostOnce,
        1 => Q::AtLeastOnce,
        _ => Q::ExactlyOnce,
    }
}

/// A client of either protocol version.
#[derive(Clone)]
enum Client {
    V4(rumqttc::Client),
    V5(rumqttc::v5::Client),
}

/// A connection (event loop) of either protocol version, with the requests kept across
/// its breaks (used by publishing connections only).
enum Connection {
    V4(Box<rumqttc::Connection>, Keeper<rumqttc::Request>),
    V5(Box<rumqttc::v5::Connection>, Keeper<rumqttc::v5::Request>),
}

/// What a request set aside at a broken connection was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A publish written before the break and not acknowledged.
    InFlight,
    /// A publish still queued in the client at the break.
    Queued,
}

/// The requests of either protocol version that a break sets aside.
trait Resendable: Sized {
    /// What a request taken from rumqttc's pending list at a break is: a publish with a
    /// packet id was written (rumqttc's in-flight state); one without came from the
    /// request channel. `None`: not a publish.
    fn kind(&self) -> Option<Kind>;
    /// Makes a kept publish fit for the next session: rumqttc gives it a fresh packet id,
    /// and DUP says it may have been sent before.
    fn renew(&mut self, kind: Kind);
    /// Identifies a publish while it moves between lists: its payload's address and length.
    fn identity(&self) -> Option<(usize, usize)>;
    /// Whether this is a QoS 2 release (PUBREL).
    fn is_release(&self) -> bool;
}

impl Resendable for rumqttc::Request {
    fn kind(&self) -> Option<Kind> {
        match self {
            Self::Publish(p) if p.pkid != 0 => Some(Kind::InFlight),
            Self::Publish(_) => Some(Kind::Queued),
            _ => None,
        }
    }

    fn renew(&mut self, kind: Kind) {
        if let Self::Publish(p) = self
            && p.qos != QoS::AtMostOnce
        {
            p.pkid = 0;
            p.dup = kind == Kind::InFlight;
        }
    }

    fn identity(&self) -> Option<(usize, usize)> {
        match self {
            Self::Publish(p) => Some((p.payload.as_ptr() as usize, p.payload.len())),
            _ => None,
        }
    }

    fn is_release(&self) -> bool {
        matches!(self, Self::PubRel(_))
    }
}

impl Resendable for rumqttc::v5::Request {
    fn kind(&self) -> Option<Kind> {
        match self {
            Self::Publish(p) if p.pkid != 0 => Some(Kind::InFlight),
            Self::Publish(_) => Some(Kind::Queued),
            _ => None,
        }
    }

    fn renew(&mut self, kind: Kind) {
        if let Self::Publish(p) = self
            && p.qos != rumqttc::v5::mqttbytes::QoS::AtMostOnce
        {
            p.pkid = 0;
            p.dup = kind == Kind::InFlight;
        }
    }

    fn identity(&self) -> Option<(usize, usize)> {
        match self {
            Self::Publish(p) => Some((p.payload.as_ptr() as usize, p.payload.len())),
            _ => None,
        }
    }

    fn is_release(&self) -> bool {
        matches!(self, Self::PubRel(_))
    }
}

/// Publishes kept across broken connections of one publishing connection.
///
/// At a break, rumqttc moves what was in flight and what was still queued into its
/// pending list, which it clears when the broker answers the reconnection with a new
/// session. [`Keeper::take`] empties that list at the break; after the reconnection
/// [`Keeper::feed`] puts one kept publish at a time back into it, only while the in-flight
/// window has room (rumqttc sends pending requests before anything else and without
/// flow control, so a longer list would overrun the window and collide on packet ids);
/// [`Keeper::settle`] counts each one once rumqttc has taken it.
struct Keeper<R> {
    kept: VecDeque<(R, Kind)>,
    /// The kept publish now in rumqttc's pending list: its kind and identity.
    given: Option<(Kind, Option<(usize, usize)>)>,
    /// QoS 2 releases set aside at a break, dropped (a new session knows nothing of them):
    /// their publishes were written and are never acknowledged.
    dropped_unacked: u64,
}

impl<R: Resendable> Keeper<R> {
    fn new() -> Self {
        Self {
            kept: VecDeque::new(),
            given: None,
            dropped_unacked: 0,
        }
    }

    /// At a break: takes everything rumqttc set aside, and a publish it parked on a packet
    /// id collision (which it would never send after a new session).
    fn take(&mut self, pending: &mut VecDeque<R>, parked: Option<R>, shared: &Shared) {
        let mut taken = std::mem::take(pending);
        if let Some((kind, id)) = self.given.take() {
            // Still where it was put (rumqttc gives a publish its packet id when it takes
            // it): it goes back to the front, and is counted once it is sent.
            let unsent = taken
                .front()
                .is_some_and(|r| r.kind() == Some(Kind::Queued) && r.identity() == id);
            if unsent {
                let r = taken.pop_front().expect("checked");
                self.kept.push_front((r, kind));
            } else {
                // rumqttc took it before the break: written (again), and if it is still
                // unacknowledged it comes back below as in flight.
                count_resent(kind, shared);
            }
        }
        for r in taken.into_iter().chain(parked) {
            match r.kind() {
                Some(Kind::InFlight) => self.kept.push_back((r, Kind::InFlight)),
                Some(Kind::Queued) => self.kept.push_back((r, Kind::Queued)),
                None if r.is_release() => self.dropped_unacked += 1,
                None => {}
            }
        }
    }

    /// Before a poll on a live connection: hands the next kept publish back to rumqttc
    /// when none is waiting there and the in-flight window has `room`.
    fn feed(&mut self, pending: &mut VecDeque<R>, room: bool) {
        if self.given.is_none()
            && pending.is_empty()
            && room
            && let Some((mut r, kind)) = self.kept.pop_front()
        {
            r.renew(kind);
            self.given = Some((kind, r.identity()));
            pending.push_back(r);
        }
    }

    /// After a poll: counts the handed-back publish once rumqttc has taken and written it.
    fn settle(&mut self, pending: &VecDeque<R>, shared: &Shared) {
        if pending.is_empty()
            && let Some((kind, _)) = self.given.take()
        {
            count_resent(kind, shared);
        }
    }

    /// Publishes held here that were written before and never acknowledged.
    fn unacked(&self) -> u64 {
        let given = u64::from(matches!(self.given, Some((Kind::InFlight, _))));
        self.kept
            .iter()
            .filter(|(_, k)| *k == Kind::InFlight)
            .count() as u64
            + given
            + self.dropped_unacked
    }
}

fn count_resent(kind: Kind, shared: &Shared) {
    match kind {
        Kind::InFlight => shared.retransmitted.fetch_add(1, Relaxed),
        Kind::Queued => shared.requeued.fetch_add(1, Relaxed),
    };
}

/// What the event loop did, in terms both versions share.
enum Ev {
    ConnAck {
        session_present: bool,
        /// MQTT 5: the broker's receive maximum (its in-flight limit for this client).
        receive_max: Option<u16>,
    },
    Written,
    Acked,
    Publish(Received),
    SubAck {
        refused: Vec<String>,
    },
    Disconnected,
    Other,
    Failed(Failure),
}

/// A connection error, classified.
#[derive(Debug, Clone)]
enum Failure {
    Auth(String),
    Refused(String),
    Network(String),
}

impl Failure {
    fn detail(&self) -> &str {
        match self {
            Self::Auth(d) | Self::Refused(d) | Self::Network(d) => d,
        }
    }

    fn into_error(self, addr: &str) -> TargetError {
        match self {
            Self::Auth(detail) => TargetError::AuthRefused {
                addr: addr.to_owned(),
                detail,
            },
            Self::Refused(detail) => TargetError::Refused {
                addr: addr.to_owned(),
                detail,
            },
            Self::Network(detail) => TargetError::Unreachable {
                addr: addr.to_owned(),
                detail,
            },
        }
    }
}

fn classify4(e: &rumqttc::ConnectionError) -> Failure {
    match e {
        rumqttc::ConnectionError::ConnectionRefused(
            c @ (ConnectReturnCode::BadUserNamePassword | ConnectReturnCode::NotAuthorized),
        ) => Failure::Auth(format!("CONNACK {c:?}")),
        rumqttc::ConnectionError::ConnectionRefused(c) => {
            Failure::Refused(format!("CONNACK {c:?}"))
        }
        other => Failure::Network(other.to_string()),
    }
}

fn classify5(e: &rumqttc::v5::ConnectionError) -> Failure {
    match e {
        rumqttc::v5::ConnectionError::ConnectionRefused(
            c @ (ConnectReturnCode5::BadUserNamePassword
            | ConnectReturnCode5::NotAuthorized
            | ConnectReturnCode5::BadAuthenticationMethod),
        ) => Failure::Auth(format!("CONNACK {c:?}")),
        rumqttc::v5::ConnectionError::ConnectionRefused(c) => {
            Failure::Refused(format!("CONNACK {c:?}"))
        }
        other => Failure::Network(other.to_string()),
    }
}

impl Connection {
    /// The next event, waiting at most `timeout` (`None`: until one comes). `None` when
    /// the wait timed out or every client handle is gone (`gone` tells which).
    fn next(&mut self, timeout: Option<Duration>, gone: &mut bool) -> Option<Ev> {
        match self {
            Self::V4(c, _) => {
                let r = match timeout {
                    None => c.recv().map_err(|_| true),
                    Some(t) => c
                        .recv_timeout(t)
                        .map_err(|e| matches!(e, rumqttc::RecvTimeoutError::Disconnected)),
                };
                match r {
                    Err(g) => {
                        *gone = g;
                        None
                    }
                    Ok(Err(e)) => Some(Ev::Failed(classify4(&e))),
                    Ok(Ok(ev)) => Some(ev4(ev)),
                }
            }
            Self::V5(c, _) => {
                let r = match timeout {
                    None => c.recv().map_err(|_| true),
                    Some(t) => c
                        .recv_timeout(t)
                        .map_err(|e| matches!(e, rumqttc::v5::RecvTimeoutError::Disconnected)),
                };
                match r {
                    Err(g) => {
                        *gone = g;
                        None
                    }
                    Ok(Err(e)) => Some(Ev::Failed(classify5(&e))),
                    Ok(Ok(ev)) => Some(ev5(ev)),
                }
            }
        }
    }

    /// Before a poll on a live connection: hands the next kept publish back to rumqttc if
    /// fewer than `window` publishes are in flight.
    fn feed(&mut self, window: u16) {
        match self {
            Self::V4(c, k) => {
                let room = c.eventloop.state.inflight() < window;
                k.feed(&mut c.eventloop.pending, room);
            }
            Self::V5(c, k) => {
                let room = c.eventloop.state.inflight() < window;
                k.feed(&mut c.eventloop.pending, room);
            }
        }
    }

    /// After a poll: counts a kept publish rumqttc has written.
    fn settle(&mut self, shared: &Shared) {
        match self {
            Self::V4(c, k) => k.settle(&c.eventloop.pending, shared),
            Self::V5(c, k) => k.settle(&c.eventloop.pending, shared),
        }
    }

    /// After a connection error: keeps what rumqttc set aside.
    fn take_kept(&mut self, shared: &Shared) {
        match self {
            Self::V4(c, k) => {
                let parked = c
                    .eventloop
                    .state
                    .collision
                    .take()
                    .map(rumqttc::Request::Publish);
                k.take(&mut c.eventloop.pending, parked, shared);
            }
            Self::V5(c, k) => {
                let parked = c
                    .eventloop
                    .state
                    .collision
                    .take()
                    .map(rumqttc::v5::Request::Publish);
                k.take(&mut c.eventloop.pending, parked, shared);
            }
        }
    }

    /// When the publishing thread ends: counts the events rumqttc read but nobody took
    /// yet, and returns how many publishes were written and never acknowledged (in flight
    /// on the connection, or kept from a break).
    fn finish(&mut self, shared: &Shared) -> u64 {
        let leftover: Vec<Ev> = match self {
            Self::V4(c, _) => c.eventloop.state.events.drain(..).map(ev4).collect(),
            Self::V5(c, _) => c.eventloop.state.events.drain(..).map(ev5).collect(),
        };
        for ev in leftover {
            match ev {
                Ev::Written => shared.written.fetch_add(1, Relaxed),
                Ev::Acked => shared.acked.fetch_add(1, Relaxed),
                _ => 0,
            };
        }
        match self {
            Self::V4(c, k) => u64::from(c.eventloop.state.inflight()) + k.unacked(),
            Self::V5(c, k) => u64::from(c.eventloop.state.inflight()) + k.unacked(),
        }
    }
}

fn ev4(ev: rumqttc::Event) -> Ev {
    use rumqttc::Event;
    match ev {
        Event::Incoming(Packet::ConnAck(a)) => Ev::ConnAck {
            session_present: a.session_present,
            receive_max: None,
        },
        Event::Incoming(Packet::PubAck(_) | Packet::PubComp(_)) => Ev::Acked,
        Event::Incoming(Packet::Publish(p)) => {
            let arrival_ns = hoptrace_probe::clock::realtime_ns();
            Ev::Publish(Received {
                topic: p.topic,
                key: None,
                payload: p.payload.to_vec(),
                meta: Meta::None,
                arrival_ns,
                broker_time: None,
            })
        }
        Event::Incoming(Packet::SubAck(s)) => Ev::SubAck {
            refused: s
                .return_codes
                .iter()
                .filter(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure))
                .map(|c| format!("{c:?}"))
                .collect(),
        },
        Event::Outgoing(Out::Publish(_)) => Ev::Written,
        Event::Outgoing(Out::Disconnect) => Ev::Disconnected,
        _ => Ev::Other,
    }
}

fn ev5(ev: rumqttc::v5::Event) -> Ev {
    use rumqttc::v5::Event;
    match ev {
        Event::Incoming(Packet5::ConnAck(a)) => Ev::ConnAck {
            session_present: a.session_present,
            receive_max: a.properties.and_then(|p| p.receive_max),
        },
        Event::Incoming(Packet5::PubAck(_) | Packet5::PubComp(_)) => Ev::Acked,
        Event::Incoming(Packet5::Publish(p)) => {
            let arrival_ns = hoptrace_probe::clock::realtime_ns();
            Ev::Publish(Received {
                topic: String::from_utf8_lossy(&p.topic).into_owned(),
                key: None,
                payload: p.payload.to_vec(),
                meta: match p.properties {
                    Some(props) if !props.user_properties.is_empty() => {
                        Meta::UserProperties(props.user_properties)
                    }
                    _ => Meta::None,
                },
                arrival_ns,
                broker_time: None,
            })
        }
        Event::Incoming(Packet5::SubAck(s)) => Ev::SubAck {
            refused: s
                .return_codes
                .iter()
                .filter(|c| !matches!(c, SubscribeReasonCode5::Success(_)))
                .map(|c| format!("{c:?}"))
                .collect(),
        },
        Event::Incoming(Packet5::Disconnect(d)) => Ev::Failed(Failure::Refused(format!(
            "broker sent DISCONNECT {:?}",
            d.reason_code
        ))),
        Event::Outgoing(Out::Publish(_)) => Ev::Written,
        Event::Outgoing(Out::Disconnect) => Ev::Disconnected,
        _ => Ev::Other,
    }
}

/// Creates a client and its connection for connection number `i`.
fn new_client(m: &MqttEndpoint, client_id: String) -> (Client, Connection) {
    let mut net = NetworkOptions::new();
    net.set_tcp_nodelay(true);
    net.set_connection_timeout(m.connect_timeout_ms.div_ceil(1000).max(1));
    let keep_alive = Duration::from_secs(m.keep_alive_s.max(5));
    match m.version {
        MqttVersion::V311 => {
            let mut o = rumqttc::MqttOptions::new(client_id, &m.host, m.port);
            o.set_keep_alive(keep_alive)
                .set_max_packet_size(MAX_PACKET_BYTES, MAX_PACKET_BYTES)
                .set_inflight(m.inflight)
                .set_clean_session(m.clean);
            if let Some(u) = &m.username {
                o.set_credentials(u, m.password.clone().unwrap_or_default());
            }
            let (c, mut conn) = rumqttc::Client::new(o, m.request_capacity);
            conn.eventloop.set_network_options(net);
            (Client::V4(c), Connection::V4(Box::new(conn), Keeper::new()))
        }
        MqttVersion::V5 => {
            let mut o = rumqttc::v5::MqttOptions::new(client_id, &m.host, m.port);
            o.set_keep_alive(keep_alive)
                .set_max_packet_size(Some(MAX_PACKET_BYTES as u32))
                .set_outgoing_inflight_upper_limit(m.inflight)
                .set_clean_start(m.clean)
                .set_network_options(net);
            if !m.clean {
                o.set_session_expiry_interval(Some(m.session_expiry_s));
            }
            if let Some(u) = &m.username {
                o.set_credentials(u, m.password.clone().unwrap_or_default());
            }
            let (c, conn) = rumqttc::v5::Client::new(o, m.request_capacity);
            (Client::V5(c), Connection::V5(Box::new(conn), Keeper::new()))
        }
    }
}

/// Counters of one publishing connection, shared with its thread.
#[derive(Debug, Default)]
struct Shared {
    written: AtomicU64,
    acked: AtomicU64,
    reconnects: AtomicU64,
    errors: AtomicU64,
    retransmitted: AtomicU64,
    requeued: AtomicU64,
    /// Set when the thread ends: publishes written and never acknowledged.
    unacked_at_end: AtomicU64,
    /// Set when the thread ends: the connection was down.
    down_at_end: AtomicBool,
    alive: AtomicBool,
    stopping: AtomicBool,
    last_error: Mutex<Option<String>>,
}

struct Conn {
    client: Client,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Publishes to an MQTT broker over one or more connections.
pub struct MqttTarget {
    conns: Vec<Conn>,
    qos: u8,
    retain: bool,
    carrier: Carrier,
    addr: String,
    describe: String,
    handed: u64,
    closed: Option<TargetStats>,
}

impl std::fmt::Debug for MqttTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttTarget")
            .field("broker", &self.describe)
            .field("connections", &self.conns.len())
            .field("carrier", &self.carrier)
            .finish_non_exhaustive()
    }
}

/// Drives one publishing connection: counts, reconnects with backoff, keeps what was in
/// flight or queued at a break and sends it again after the reconnection, reports the
/// first connection's outcome on `ready`. `inflight`: the client's in-flight window.
fn drive(
    mut conn: Connection,
    shared: &Shared,
    ready: &mpsc::SyncSender<Result<(), Failure>>,
    addr: &str,
    inflight: u16,
) {
    let mut connected_once = false;
    let mut connected = false;
    let mut window = inflight;
    let mut backoff = Duration::from_millis(100);
    let mut gone = false;
    loop {
        if connected {
            conn.feed(window);
        }
        let Some(ev) = conn.next(None, &mut gone) else {
            break;
        };
        conn.settle(shared);
        match ev {
            Ev::ConnAck { receive_max, .. } => {
                connected = true;
                window = receive_max.map_or(inflight, |r| r.min(inflight));
                if connected_once {
                    shared.reconnects.fetch_add(1, Relaxed);
                    tracing::info!(broker = addr, "reconnected");
                } else {
                    connected_once = true;
                    let _ = ready.send(Ok(()));
                }
                backoff = Duration::from_millis(100);
            }
            Ev::Written => {
                shared.written.fetch_add(1, Relaxed);
            }
            Ev::Acked => {
                shared.acked.fetch_add(1, Relaxed);
            }
            Ev::Disconnected => break,
            Ev::Publish(_) | Ev::SubAck { .. } | Ev::Other => {}
            Ev::Failed(f) => {
                connected = false;
                conn.take_kept(shared);
                if !connected_once {
                    let _ = ready.send(Err(f));
                    break;
                }
                if shared.stopping.load(Relaxed) {
                    break;
                }
                shared.errors.fetch_add(1, Relaxed);
                tracing::warn!(
                    broker = addr,
                    "MQTT connection error: {}; reconnecting in {backoff:?}",
                    f.detail()
                );
                *shared.last_error.lock().expect("poisoned") = Some(f.detail().to_owned());
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
    shared.unacked_at_end.store(conn.finish(shared), Relaxed);
    shared.down_at_end.store(!connected, Relaxed);
    shared.alive.store(false, Relaxed);
}

impl MqttTarget {
    /// Opens `m.connections` connections and waits until the broker accepted each.
    ///
    /// # Errors
    /// [`TargetError::Unreachable`], [`TargetError::AuthRefused`],
    /// [`TargetError::Refused`], or a carrier MQTT cannot carry.
    pub fn connect(m: &MqttEndpoint, carrier: Carrier, name: &str) -> Result<Self, TargetError> {
        let addr = join_host_port(&m.host, m.port);
        match (carrier, m.version) {
            (Carrier::Envelope, _) | (Carrier::Property, MqttVersion::V5) => {}
            _ => {
                return Err(TargetError::Client(format!(
                    "MQTT {} cannot carry the context in a {carrier}",
                    if m.version == MqttVersion::V5 {
                        "5"
                    } else {
                        "3.1.1"
                    }
                )));
            }
        }
        if !m.clean {
            return Err(TargetError::Client(
                "clean=false is for taps and recorders: the publisher itself keeps what was in \
                 flight or queued when a connection broke and sends it again"
                    .into(),
            ));
        }
        let timeout = Duration::from_millis(m.connect_timeout_ms);
        super::check_reachable(&[(m.host.clone(), m.port)], timeout)?;
        let prefix = m
            .client_id
            .clone()
            .unwrap_or_else(|| super::client_tag(name));
        let mut conns = Vec::with_capacity(m.connections);
        let mut waits = Vec::with_capacity(m.connections);
        for i in 0..m.connections {
            let (client, conn) = new_client(m, format!("{prefix}-{i}"));
            let shared = Arc::new(Shared {
                alive: AtomicBool::new(true),
                ..Shared::default()
            });
            let (tx, rx) = mpsc::sync_channel(1);
            let thread = {
                let shared = Arc::clone(&shared);
                let addr = addr.clone();
                let inflight = m.inflight;
                std::thread::Builder::new()
                    .name(format!("mqtt-pub-{i}"))
                    .spawn(move || drive(conn, &shared, &tx, &addr, inflight))
                    .map_err(|e| TargetError::Client(format!("cannot spawn a thread: {e}")))?
            };
            conns.push(Conn {
                client,
                shared,
                thread: Some(thread),
            });
            waits.push(rx);
        }
        let mut target = Self {
            conns,
            qos: m.qos,
            retain: m.retain,
            carrier,
            addr: addr.clone(),
            describe: crate::url::Endpoint::Mqtt(m.clone()).display(),
            handed: 0,
            closed: None,
        };
        let deadline = Instant::now() + timeout + Duration::from_secs(1);
        for rx in waits {
            let left = deadline.saturating_duration_since(Instant::now());
            let outcome = match rx.recv_timeout(left) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(f)) => Err(f.into_error(&addr)),
                Err(_) => Err(TargetError::Unreachable {
                    addr: addr.clone(),
                    detail: format!("no CONNACK within {} ms", timeout.as_millis()),
                }),
            };
            if let Err(e) = outcome {
                target.close(Duration::ZERO);
                return Err(e);
            }
        }
        tracing::info!(broker = %target.describe, connections = m.connections, %carrier, "connected");
        Ok(target)
    }

    fn confirmed(&self) -> u64 {
        self.conns
            .iter()
            .map(|c| {
                if self.qos == 0 {
                    c.shared.written.load(Relaxed)
                } else {
                    c.shared.acked.load(Relaxed)
                }
            })
            .sum()
    }
}

impl Target for MqttTarget {
    fn try_send(&mut self, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let n = self.conns.len();
        let conn = &self.conns[msg.stream as usize % n];
        let result = match &conn.client {
            Client::V4(c) => {
                let mut payload = Vec::new();
                match msg.context {
                    Some(context) => envelope::wrap_into(context, msg.payload, &mut payload),
                    None => payload.extend_from_slice(msg.payload),
                }
                c.try_publish(msg.topic, qos_of(self.qos), self.retain, payload)
                    .map_err(|_| ())
            }
            Client::V5(c) => {
                let mut props = PublishProperties::default();
                for (k, v) in msg.headers {
                    if k != HEADER {
                        props
                            .user_properties
                            .push((k.clone(), String::from_utf8_lossy(v).into_owned()));
                    }
                }
                let payload = match msg.context {
                    None => msg.payload.to_vec(),
                    Some(context) if self.carrier == Carrier::Property => {
                        props
                            .user_properties
                            .push((HEADER.to_owned(), context.to_text()));
                        msg.payload.to_vec()
                    }
                    Some(context) => envelope::wrap(context, msg.payload),
                };
                let q = qos5_of(self.qos);
                if props.user_properties.is_empty() {
                    c.try_publish(msg.topic, q, self.retain, payload)
                } else {
                    c.try_publish_with_properties(msg.topic, q, self.retain, payload, props)
                }
                .map_err(|_| ())
            }
        };
        match result {
            Ok(()) => {
                self.handed += 1;
                Ok(())
            }
            Err(()) if !rumqttc::valid_topic(msg.topic) => Err(SendError::Failed(
                TargetError::Client(format!("{:?} is not a valid MQTT topic name", msg.topic)),
            )),
            Err(()) if !conn.shared.alive.load(Relaxed) => {
                Err(SendError::Failed(TargetError::Closed {
                    addr: self.addr.clone(),
                    detail: conn
                        .shared
                        .last_error
                        .lock()
                        .expect("poisoned")
                        .clone()
                        .unwrap_or_else(|| "the connection stopped".into()),
                }))
            }
            Err(()) => Err(SendError::Full),
        }
    }

    fn wait_for_capacity(&mut self, max: Duration) {
        std::thread::sleep(max.min(Duration::from_micros(50)));
    }

    fn stats(&self) -> TargetStats {
        if let Some(s) = self.closed {
            return s;
        }
        let sum = |f: fn(&Shared) -> &AtomicU64| -> u64 {
            self.conns.iter().map(|c| f(&c.shared).load(Relaxed)).sum()
        };
        TargetStats {
            handed: self.handed,
            written: sum(|s| &s.written),
            acked: sum(|s| &s.acked),
            failed: 0,
            unconfirmed: 0,
            reconnects: sum(|s| &s.reconnects),
            connection_errors: sum(|s| &s.errors),
            retransmitted: sum(|s| &s.retransmitted),
            requeued: sum(|s| &s.requeued),
            mqtt_qos: Some(self.qos),
            ..TargetStats::default()
        }
    }

    fn close(&mut self, timeout: Duration) -> TargetStats {
        if let Some(s) = self.closed {
            return s;
        }
        let deadline = Instant::now() + timeout;
        while self.confirmed() < self.handed
            && Instant::now() < deadline
            && self.conns.iter().any(|c| c.shared.alive.load(Relaxed))
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        for c in &self.conns {
            c.shared.stopping.store(true, Relaxed);
            let _ = match &c.client {
                Client::V4(cl) => cl.try_disconnect().map_err(|_| ()),
                Client::V5(cl) => cl.try_disconnect().map_err(|_| ()),
            };
        }
        let join_deadline = Instant::now() + Duration::from_secs(3);
        for c in &mut self.conns {
            while c.thread.as_ref().is_some_and(|t| !t.is_finished())
                && Instant::now() < join_deadline
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            match c.thread.take() {
                Some(t) if t.is_finished() => {
                    let _ = t.join();
                }
                Some(_) => {
                    tracing::warn!(broker = %self.addr, "an MQTT connection did not close in time")
                }
                None => {}
            }
        }
        let mut s = self.stats();
        s.unconfirmed = self.handed.saturating_sub(self.confirmed());
        if self.qos > 0 {
            let unacked: u64 = self
                .conns
                .iter()
                .map(|c| c.shared.unacked_at_end.load(Relaxed))
                .sum();
            s.abandoned_unacked = unacked.min(s.unconfirmed);
        }
        s.abandoned_unwritten = s.unconfirmed - s.abandoned_unacked;
        s.down_at_close = self
            .conns
            .iter()
            .filter(|c| c.shared.down_at_end.load(Relaxed))
            .count() as u64;
        if s.unconfirmed > 0 {
            tracing::error!(
                broker = %self.addr,
                unconfirmed = s.unconfirmed,
                written_unacknowledged = s.abandoned_unacked,
                never_written = s.abandoned_unwritten,
                connections_down = s.down_at_close,
                "messages handed to the MQTT client were not {} before closing",
                if self.qos == 0 { "written" } else { "acknowledged" }
            );
        }
        self.closed = Some(s);
        s
    }

    fn carrier(&self) -> Carrier {
        self.carrier
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }
}

impl Drop for MqttTarget {
    fn drop(&mut self) {
        if self.closed.is_none() {
            let _ = self.close(Duration::ZERO);
        }
    }
}

/// Subscribes to an MQTT broker and hands over every publish it delivers.
pub struct MqttSource {
    client: Client,
    conn: Connection,
    filters: Vec<String>,
    qos: u8,
    addr: String,
    describe: String,
    reconnects: u64,
    new_sessions: u64,
    broken_since: Option<Instant>,
    /// Messages delivered before the subscriptions were acknowledged (a persistent
    /// session's queue comes right after the CONNACK), handed over first.
    early: VecDeque<Received>,
}

impl std::fmt::Debug for MqttSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttSource")
            .field("broker", &self.describe)
            .field("filters", &self.filters)
            .finish_non_exhaustive()
    }
}

impl MqttSource {
    /// Connects and subscribes to `filters` (default `#`), returning once the broker
    /// acknowledged every subscription.
    ///
    /// # Errors
    /// [`TargetError::Unreachable`], [`TargetError::AuthRefused`],
    /// [`TargetError::Refused`] (also for a refused subscription).
    pub fn connect(m: &MqttEndpoint, filters: &[String], name: &str) -> Result<Self, TargetError> {
        let addr = join_host_port(&m.host, m.port);
        let timeout = Duration::from_millis(m.connect_timeout_ms);
        super::check_reachable(&[(m.host.clone(), m.port)], timeout)?;
        let filters: Vec<String> = if filters.is_empty() {
            vec![
                m.prefix
                    .as_ref()
                    .map_or_else(|| "#".to_owned(), |p| format!("{p}/#")),
            ]
        } else {
            filters.to_vec()
        };
        for f in &filters {
            if !rumqttc::valid_filter(f) {
                return Err(TargetError::Client(format!(
                    "{f:?} is not a valid MQTT topic filter"
                )));
            }
        }
        let id = m
            .client_id
            .clone()
            .unwrap_or_else(|| super::client_tag(name));
        if !m.clean && m.qos == 0 {
            tracing::warn!(
                broker = %addr,
                "clean=false with qos=0: brokers keep only QoS 1/2 messages for a disconnected session; add qos=1"
            );
        }
        let mut ep = m.clone();
        ep.request_capacity = ep.request_capacity.max(filters.len() + 16);
        let (client, conn) = new_client(&ep, id);
        let mut s = Self {
            client,
            conn,
            filters,
            qos: m.qos,
            addr: addr.clone(),
            describe: crate::url::Endpoint::Mqtt(m.clone()).display(),
            reconnects: 0,
            new_sessions: 0,
            broken_since: None,
            early: VecDeque::new(),
        };
        s.subscribe_all()?;
        let deadline = Instant::now() + timeout + Duration::from_secs(1);
        let mut connected = false;
        let mut acks = 0;
        let mut gone = false;
        while acks < s.filters.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TargetError::Unreachable {
                    addr,
                    detail: format!(
                        "no {} within {} ms",
                        if connected { "SUBACK" } else { "CONNACK" },
                        timeout.as_millis()
                    ),
                });
            }
            match s.conn.next(Some(left), &mut gone) {
                Some(Ev::ConnAck { .. }) => connected = true,
                Some(Ev::SubAck { refused }) => {
                    if !refused.is_empty() {
                        return Err(TargetError::Refused {
                            addr,
                            detail: format!(
                                "subscription to {:?} refused: {}",
                                s.filters,
                                refused.join(", ")
                            ),
                        });
                    }
                    acks += 1;
                }
                Some(Ev::Publish(r)) => s.early.push_back(r),
                Some(Ev::Failed(f)) => return Err(f.into_error(&addr)),
                Some(_) => {}
                None if gone => {
                    return Err(TargetError::Closed {
                        addr,
                        detail: "the client stopped".into(),
                    });
                }
                None => {}
            }
        }
        tracing::info!(broker = %s.describe, filters = ?s.filters, queued = s.early.len(), "subscribed");
        Ok(s)
    }

    fn subscribe_all(&self) -> Result<(), TargetError> {
        for f in &self.filters {
            let r = match &self.client {
                Client::V4(c) => c.try_subscribe(f, qos_of(self.qos)).map_err(|_| ()),
                Client::V5(c) => c.try_subscribe(f, qos5_of(self.qos)).map_err(|_| ()),
            };
            r.map_err(|()| TargetError::Client(format!("cannot queue the subscription to {f}")))?;
        }
        Ok(())
    }
}

impl Source for MqttSource {
    fn recv(&mut self, timeout: Duration) -> Result<Option<Received>, TargetError> {
        if let Some(r) = self.early.pop_front() {
            return Ok(Some(r));
        }
        let deadline = Instant::now() + timeout;
        let mut gone = false;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            match self.conn.next(Some(left), &mut gone) {
                Some(Ev::Publish(r)) => return Ok(Some(r)),
                Some(Ev::ConnAck {
                    session_present, ..
                }) => {
                    if self.broken_since.take().is_some() {
                        self.reconnects += 1;
                        if session_present {
                            tracing::info!(broker = %self.addr, "reconnected; the broker kept the session and delivers what it queued for it");
                        } else {
                            self.new_sessions += 1;
                            tracing::warn!(broker = %self.addr, "reconnected to a new session: subscribing again; messages published since the connection broke were not kept for this subscriber");
                            self.subscribe_all()?;
                        }
                    }
                }
                Some(Ev::Failed(f)) => {
                    let since = *self.broken_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_secs(30) {
                        return Err(f.into_error(&self.addr));
                    }
                    tracing::warn!(broker = %self.addr, "MQTT connection error: {}; reconnecting", f.detail());
                    std::thread::sleep(left.min(Duration::from_millis(200)));
                }
                Some(_) => {}
                None if gone => {
                    return Err(TargetError::Closed {
                        addr: self.addr.clone(),
                        detail: "the client stopped".into(),
                    });
                }
                None => return Ok(None),
            }
        }
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn reconnects(&self) -> u64 {
        self.reconnects
    }

    fn new_sessions(&self) -> u64 {
        self.new_sessions
    }

    fn close(&mut self) {
        let _ = match &self.client {
            Client::V4(c) => c.try_disconnect().map_err(|_| ()),
            Client::V5(c) => c.try_disconnect().map_err(|_| ()),
        };
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut gone = false;
        while Instant::now() < deadline {
            match self.conn.next(Some(Duration::from_millis(100)), &mut gone) {
                Some(Ev::Disconnected | Ev::Failed(_)) => break,
                None if gone => break,
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;
