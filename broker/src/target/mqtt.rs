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

mod client;
mod resend;
mod shared;
mod source;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hoptrace_probe::carrier::{HEADER, envelope};
use rumqttc::v5::mqttbytes::v5::PublishProperties;

use super::{Outgoing, SendError, Target, TargetError, TargetStats};
use crate::url::{Carrier, MqttEndpoint, MqttVersion, join_host_port};
use client::{Client, Connection, Ev, Failure, new_client, qos_of, qos5_of};
use shared::Shared;
pub use source::MqttSource;

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

#[cfg(test)]
mod tests;
