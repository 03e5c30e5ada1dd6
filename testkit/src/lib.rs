//! Helpers shared by hoptrace's tests (a dev-dependency only, never of a library's normal
//! build): the addresses of the services `infra/test.sh` starts, fresh scratch
//! directories, ids unlikely to collide with earlier runs, ports nothing listens on, and
//! waiting for a condition without fixed sleeps, and the accept loop of the small servers
//! tests write ([`Acceptor`]).
//!
//! Tests that need a service are `#[ignore]`d, so a plain `cargo test` lists them as
//! ignored; `infra/test.sh` runs them with `--include-ignored` after starting the services
//! and exporting their addresses (`infra/env.sh`). A test that runs without its service
//! fails with a message saying how to provide it: it never passes without running.
//!
//! It depends on nothing but the standard library.
#![deny(missing_docs, unreachable_pub)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `host:port` of a service from the environment variable `var` (`HOPTRACE_MQTT`,
/// `HOPTRACE_KAFKA`, ... of `infra/env.sh`).
///
/// # Panics
/// When `var` is not set, with how to start the services.
pub fn broker(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: this test needs the brokers (infra/services.sh up; \
             source infra/env.sh), as infra/test.sh does"
        )
    })
}

/// [`broker`] split into host and port.
///
/// # Panics
/// When `var` is not set or does not hold `host:port`.
pub fn broker_host_port(var: &str) -> (String, u16) {
    let v = broker(var);
    let (h, p) = v
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{var}={v} is not host:port"));
    let port = p
        .parse()
        .unwrap_or_else(|_| panic!("{var}={v}: '{p}' is not a port"));
    (h.to_owned(), port)
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// A number that differs between calls and between processes (the process id, the wall
/// clock and a counter), for names that must not collide with earlier runs.
pub fn unique() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mixed = (now_ns() as u64) ^ (u64::from(std::process::id()) << 32) ^ n.rotate_left(48);
    // A few rounds of splitmix64 so that nearby inputs give unrelated outputs.
    let mut z = mixed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A publisher id (never 0) unlikely to collide with earlier runs on the same broker.
pub fn unique_id() -> u16 {
    (unique() as u16).max(1)
}

/// A fresh, empty directory under the system's temporary directory, named after `tag`.
///
/// # Panics
/// When the directory cannot be created.
pub fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "hoptrace-{tag}-{}-{:x}",
        std::process::id(),
        unique()
    ));
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
    d
}

/// A loopback port nothing listens on (bound and released again).
///
/// # Panics
/// When no loopback port can be bound.
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    l.local_addr().expect("the bound address").port()
}

/// Polls `f` (every 5 ms, never a fixed sleep) until it holds.
///
/// # Panics
/// When `timeout` passes first, naming `what`.
pub fn wait_for(what: &str, timeout: Duration, f: impl FnMut() -> bool) {
    assert!(poll_until(timeout, f), "timed out waiting for {what}");
}

/// Polls `f` (every 5 ms) until it holds or `timeout` passes; whether it held. For a
/// caller that has something to clean up or to show before it fails.
pub fn poll_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `child`'s exit status once it exits, or `None` when it still runs after `timeout` (std
/// has no wait with a timeout: it is polled).
///
/// # Panics
/// When the child's status cannot be read.
pub fn exit_within(
    child: &mut std::process::Child,
    timeout: Duration,
) -> Option<std::process::ExitStatus> {
    let mut status = None;
    poll_until(timeout, || {
        status = child.try_wait().expect("reading a child's status");
        status.is_some()
    });
    status
}

/// The accept loop of a server a test writes (a collector or a store that behaves in some
/// way): blocking accepts on a thread of its own, each connection handed to `handle` on
/// that thread (which starts a thread per connection where it needs one). [`Self::stop`]
/// (or dropping it) wakes the last accept with a connection of its own and waits for the
/// loop to end: the port is free when it returns.
#[derive(Debug)]
pub struct Acceptor {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Acceptor {
    /// Accepts on `listener` until stopped.
    ///
    /// # Panics
    /// When the listener has no local address.
    pub fn spawn(
        listener: TcpListener,
        mut handle: impl FnMut(TcpStream) + Send + 'static,
    ) -> Self {
        let addr = listener.local_addr().expect("a bound listener");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok(conn) = conn {
                    handle(conn);
                }
            }
        });
        Self {
            addr,
            stop,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// The address it listens on.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and closes the listener (idempotent).
    ///
    /// # Panics
    /// When the accept loop panicked.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = TcpStream::connect(self.addr);
            t.join().expect("the accept loop ended");
        }
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_directories_and_ids_do_not_repeat() {
        let a = tempdir("kit");
        let b = tempdir("kit");
        assert_ne!(a, b);
        assert!(a.is_dir() && b.is_dir());
        let ids: std::collections::BTreeSet<u64> = (0..1000).map(|_| unique()).collect();
        assert_eq!(ids.len(), 1000);
        assert_ne!(unique_id(), 0);
        let _ = std::fs::remove_dir_all(a);
        let _ = std::fs::remove_dir_all(b);
    }

    #[test]
    fn a_stopped_acceptor_has_freed_its_port() {
        let seen = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&seen);
        let a = Acceptor::spawn(TcpListener::bind("127.0.0.1:0").unwrap(), move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
        });
        let addr = a.addr();
        drop(TcpStream::connect(addr).unwrap());
        wait_for("the connection", Duration::from_secs(5), || {
            seen.load(Ordering::Relaxed) == 1
        });
        a.stop();
        assert!(
            TcpStream::connect(addr).is_err(),
            "nothing listens any more"
        );
        assert_eq!(
            seen.load(Ordering::Relaxed),
            1,
            "the wake-up is not handed on"
        );
        drop(TcpListener::bind(addr).expect("the port is free again"));
    }

    #[test]
    fn a_closed_port_refuses_connections() {
        let p = closed_port();
        assert!(std::net::TcpStream::connect(("127.0.0.1", p)).is_err());
    }

    #[test]
    #[should_panic(expected = "HOPTRACE_TESTKIT_UNSET is not set")]
    fn a_missing_service_address_fails_with_how_to_start_it() {
        broker("HOPTRACE_TESTKIT_UNSET");
    }
}
