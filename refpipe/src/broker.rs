//! An MQTT broker in this process (rumqttd), for the demo when no external broker is
//! given. It speaks MQTT 5 and 3.1.1 on loopback.
//!
//! rumqttd does not set TCP_NODELAY on the connections it accepts, so small deliveries
//! would wait for Nagle's algorithm and the delayed ACK of the subscriber (the demo's
//! Broker Time was P50 6.4 ms at 5k messages/s, against 0.1-0.8 ms through Mosquitto with
//! `set_tcp_nodelay true`). The broker runs in this process, so once its listeners are
//! up [`EmbeddedBroker::start`] sets TCP_NODELAY on them; on Linux every connection
//! accepted from a listening socket inherits its options.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rumqttd::{Broker, Config, ConnectionSettings, RouterConfig, ServerSettings};

use crate::RefpipeError;

/// A running embedded broker. It runs until the process ends.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddedBroker {
    v5: SocketAddr,
    v4: SocketAddr,
}

impl EmbeddedBroker {
    /// Starts the broker on two free loopback ports (MQTT 5 and 3.1.1) and waits until
    /// both accept connections.
    ///
    /// # Errors
    /// [`RefpipeError::Broker`] when no port is free or the broker does not come up.
    pub fn start(max_payload_bytes: usize) -> Result<Self, RefpipeError> {
        let [v5, v4] = free_ports()?;
        let connections = ConnectionSettings {
            connection_timeout_ms: 10_000,
            max_payload_size: max_payload_bytes,
            max_inflight_count: 500,
            auth: None,
            external_auth: None,
            dynamic_filters: true,
        };
        let server = |name: &str, listen| ServerSettings {
            name: name.to_owned(),
            listen,
            tls: None,
            next_connection_delay_ms: 1,
            connections: connections.clone(),
        };
        let config = Config {
            id: 0,
            router: RouterConfig {
                max_connections: 1_000,
                max_outgoing_packet_count: 1_000,
                max_segment_size: 100 << 20,
                max_segment_count: 10,
                ..RouterConfig::default()
            },
            v4: Some(HashMap::from([("1".to_owned(), server("v4", v4))])),
            v5: Some(HashMap::from([("1".to_owned(), server("v5", v5))])),
            ..Config::default()
        };
        let mut broker = Broker::new(config);
        std::thread::Builder::new()
            .name("mqtt-broker".into())
            .spawn(move || {
                if let Err(e) = broker.start() {
                    tracing::error!("the embedded MQTT broker stopped: {e}");
                }
            })
            .map_err(|e| RefpipeError::Broker(format!("cannot start its thread: {e}")))?;
        for addr in [v5, v4] {
            wait_for(addr)?;
        }
        let set = set_nodelay_on_sockets_of(&[v5.port(), v4.port()]);
        if set < 2 {
            tracing::warn!(
                sockets = set,
                "could not set TCP_NODELAY on the embedded broker's listeners: small messages may wait for Nagle's algorithm"
            );
        }
        tracing::info!(%v5, %v4, "embedded MQTT broker up");
        Ok(Self { v5, v4 })
    }

    /// `mqtt://` address of the MQTT 5 listener.
    #[must_use]
    pub fn url_v5(&self) -> String {
        format!("mqtt://{}?version=5", self.v5)
    }

    /// `mqtt://` address of the MQTT 3.1.1 listener.
    #[must_use]
    pub fn url_v311(&self) -> String {
        format!("mqtt://{}?version=3.1.1", self.v4)
    }
}

/// Sets TCP_NODELAY on every IPv4 TCP socket of this process whose local port is one of
/// `ports` (the broker's listeners, and any connection already accepted); returns how
/// many were set.
#[cfg(target_os = "linux")]
fn set_nodelay_on_sockets_of(ports: &[u16]) -> usize {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mut set = 0;
    for entry in fds.flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<libc::c_int>() else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // SAFETY: `addr` is a zeroed sockaddr_in of `len` bytes that getsockname fills;
        // a descriptor that is not (or no longer) a socket makes it fail, which is skipped.
        let port = unsafe {
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let ok =
                libc::getsockname(fd, (&raw mut addr).cast::<libc::sockaddr>(), &raw mut len) == 0;
            (ok && libc::c_int::from(addr.sin_family) == libc::AF_INET)
                .then(|| u16::from_be(addr.sin_port))
        };
        if !port.is_some_and(|p| ports.contains(&p)) {
            continue;
        }
        let one: libc::c_int = 1;
        // SAFETY: a valid pointer to a c_int of the size given, for a TCP socket option.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&raw const one).cast::<libc::c_void>(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        set += usize::from(rc == 0);
    }
    set
}

#[cfg(not(target_os = "linux"))]
fn set_nodelay_on_sockets_of(_ports: &[u16]) -> usize {
    0
}

/// Two different free loopback ports: both listeners are held until both are picked, so
/// the system cannot hand out the same port twice.
fn free_ports() -> Result<[SocketAddr; 2], RefpipeError> {
    let bind = || TcpListener::bind("127.0.0.1:0");
    (|| {
        let (a, b) = (bind()?, bind()?);
        Ok([a.local_addr()?, b.local_addr()?])
    })()
    .map_err(|e: std::io::Error| RefpipeError::Broker(format!("no free loopback port: {e}")))
}

fn wait_for(addr: SocketAddr) -> Result<(), RefpipeError> {
    let started = Instant::now();
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(100)) {
            Ok(_) => return Ok(()),
            Err(e) if started.elapsed() > Duration::from_secs(5) => {
                return Err(RefpipeError::Broker(format!(
                    "not listening on {addr} after 5 s: {e}"
                )));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The port of a socket address `f` (getsockname or getpeername) fills in.
    fn port_of(
        fd: libc::c_int,
        f: unsafe extern "C" fn(
            libc::c_int,
            *mut libc::sockaddr,
            *mut libc::socklen_t,
        ) -> libc::c_int,
    ) -> Option<u16> {
        // SAFETY: `addr` is a zeroed sockaddr_in of `len` bytes that `f` fills; a
        // descriptor that is not an IPv4 socket makes it fail or gives another family.
        unsafe {
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let ok = f(fd, (&raw mut addr).cast::<libc::sockaddr>(), &raw mut len) == 0;
            (ok && libc::c_int::from(addr.sin_family) == libc::AF_INET)
                .then(|| u16::from_be(addr.sin_port))
        }
    }

    /// TCP_NODELAY of the socket of this process whose local port is `local` and whose
    /// peer's port is `peer` (a connection the broker accepted), if there is one.
    fn nodelay_of_accepted(local: u16, peer: u16) -> Option<bool> {
        for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
            let Ok(fd) = entry.file_name().to_string_lossy().parse::<libc::c_int>() else {
                continue;
            };
            if port_of(fd, libc::getsockname) != Some(local)
                || port_of(fd, libc::getpeername) != Some(peer)
            {
                continue;
            }
            let mut v: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: a valid pointer to a c_int and its size, for a TCP socket option.
            let rc = unsafe {
                libc::getsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_NODELAY,
                    (&raw mut v).cast::<libc::c_void>(),
                    &raw mut len,
                )
            };
            return (rc == 0).then_some(v != 0);
        }
        None
    }

    #[test]
    fn connections_the_broker_accepts_have_tcp_nodelay() {
        let b = EmbeddedBroker::start(1 << 16).unwrap();
        for addr in [b.v5, b.v4] {
            let client = TcpStream::connect(addr).unwrap();
            let peer = client.local_addr().unwrap().port();
            let started = Instant::now();
            let nodelay = loop {
                if let Some(v) = nodelay_of_accepted(addr.port(), peer) {
                    break v;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "the broker did not accept the connection to {addr}"
                );
                std::thread::sleep(Duration::from_millis(5));
            };
            assert!(
                nodelay,
                "a connection accepted on {addr} waits for Nagle's algorithm"
            );
        }
    }
}
