//! MQTT 3.1.1 and 5 behind one face: rumqttc's clients, connections and events of either
//! version, the failures they report, and how a connection is made.

use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::{
    ConnectReturnCode as ConnectReturnCode5, Packet as Packet5,
    SubscribeReasonCode as SubscribeReasonCode5,
};
use rumqttc::{ConnectReturnCode, NetworkOptions, Outgoing as Out, Packet, QoS};

use std::sync::atomic::Ordering::Relaxed;

use super::resend::Keeper;
use super::shared::{MAX_PACKET_BYTES, Shared};
use crate::target::{Meta, Received, TargetError};
use crate::url::{MqttEndpoint, MqttVersion};

pub(super) fn qos_of(q: u8) -> QoS {
    match q {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

pub(super) fn qos5_of(q: u8) -> rumqttc::v5::mqttbytes::QoS {
    use rumqttc::v5::mqttbytes::QoS as Q;
    match q {
        0 => Q::AtMostOnce,
        1 => Q::AtLeastOnce,
        _ => Q::ExactlyOnce,
    }
}

/// A client of either protocol version.
#[derive(Clone)]
pub(super) enum Client {
    V4(rumqttc::Client),
    V5(rumqttc::v5::Client),
}

/// A connection (event loop) of either protocol version, with the requests kept across
/// its breaks (used by publishing connections only).
pub(super) enum Connection {
    V4(Box<rumqttc::Connection>, Keeper<rumqttc::Request>),
    V5(Box<rumqttc::v5::Connection>, Keeper<rumqttc::v5::Request>),
}

/// What the event loop did, in terms both versions share.
pub(super) enum Ev {
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
pub(super) enum Failure {
    Auth(String),
    Refused(String),
    Network(String),
}

impl Failure {
    pub(super) fn detail(&self) -> &str {
        match self {
            Self::Auth(d) | Self::Refused(d) | Self::Network(d) => d,
        }
    }

    pub(super) fn into_error(self, addr: &str) -> TargetError {
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

pub(super) fn classify4(e: &rumqttc::ConnectionError) -> Failure {
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

pub(super) fn classify5(e: &rumqttc::v5::ConnectionError) -> Failure {
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
    pub(super) fn next(&mut self, timeout: Option<Duration>, gone: &mut bool) -> Option<Ev> {
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
    pub(super) fn feed(&mut self, window: u16) {
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
    pub(super) fn settle(&mut self, shared: &Shared) {
        match self {
            Self::V4(c, k) => k.settle(&c.eventloop.pending, shared),
            Self::V5(c, k) => k.settle(&c.eventloop.pending, shared),
        }
    }

    /// After a connection error: keeps what rumqttc set aside.
    pub(super) fn take_kept(&mut self, shared: &Shared) {
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
    pub(super) fn finish(&mut self, shared: &Shared) -> u64 {
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

pub(super) fn ev4(ev: rumqttc::Event) -> Ev {
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

pub(super) fn ev5(ev: rumqttc::v5::Event) -> Ev {
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
pub(super) fn new_client(m: &MqttEndpoint, client_id: String) -> (Client, Connection) {
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
