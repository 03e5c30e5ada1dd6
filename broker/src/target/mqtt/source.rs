//! Subscribing to an MQTT broker: every publish it delivers, handed over as received.

use std::time::{Duration, Instant};

use super::client::{Client, Connection, Ev, new_client, qos_of, qos5_of};
use std::collections::VecDeque;

use crate::target::{Received, Source, TargetError, check_reachable, client_tag};
use crate::url::{MqttEndpoint, join_host_port};

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
        check_reachable(&[(m.host.clone(), m.port)], timeout)?;
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
        let id = m.client_id.clone().unwrap_or_else(|| client_tag(name));
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

    pub(super) fn subscribe_all(&self) -> Result<(), TargetError> {
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
