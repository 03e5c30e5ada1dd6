//! A minimal collector for the probe's own tests: accepts connections, answers Hello
//! with Welcome (or Reject), and keeps every frame it receives.

#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hoptrace_protocol::Frame;
use hoptrace_protocol::{self as protocol, MAX_FRAME_LEN};
use hoptrace_testkit::Acceptor;

/// Frames received, tagged with the connection number they came on.
pub type Received = Arc<Mutex<Vec<(usize, Frame)>>>;

/// How a [`MiniCollector`] speaks version 2: what it says to resume after, and whether
/// it acknowledges the numbered frames it receives.
#[derive(Debug, Clone, Default)]
pub struct Durable {
    /// `resume_seq` of every Welcome.
    pub resume: Arc<std::sync::atomic::AtomicU64>,
    /// Acknowledge each SeqRecords frame at once.
    pub ack: Arc<AtomicBool>,
}

pub struct MiniCollector {
    pub addr: SocketAddr,
    pub frames: Received,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Acceptor,
}

impl MiniCollector {
    /// A version 1 collector (no acknowledgements).
    pub fn start(reject: Option<&'static str>) -> Self {
        Self::start_on(TcpListener::bind("127.0.0.1:0").unwrap(), reject)
    }

    pub fn start_on(listener: TcpListener, reject: Option<&'static str>) -> Self {
        Self::start_with(listener, reject, None)
    }

    /// A version 2 collector.
    pub fn durable(mode: &Durable) -> Self {
        Self::start_with(
            TcpListener::bind("127.0.0.1:0").unwrap(),
            None,
            Some(mode.clone()),
        )
    }

    /// A version 2 collector on `listener` (a collector started again on its address).
    pub fn durable_on(listener: TcpListener, mode: &Durable) -> Self {
        Self::start_with(listener, None, Some(mode.clone()))
    }

    /// A collector of protocol version 1 only, as one built before version 2: it rejects
    /// a version 2 Hello (code 1, unsupported version) and welcomes a version 1 Hello.
    pub fn version_1_only() -> Self {
        Self::start_with(
            TcpListener::bind("127.0.0.1:0").unwrap(),
            Some(V1_ONLY),
            None,
        )
    }

    fn start_with(
        listener: TcpListener,
        reject: Option<&'static str>,
        durable: Option<Durable>,
    ) -> Self {
        let frames: Received = Arc::default();
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (f, c) = (frames.clone(), conns.clone());
        let mut id = 0;
        let acceptor = Acceptor::spawn(listener, move |stream| {
            c.lock().unwrap().push(stream.try_clone().unwrap());
            let (f, durable) = (f.clone(), durable.clone());
            let n = id;
            id += 1;
            std::thread::spawn(move || serve(stream, n, &f, reject, durable));
        });
        Self {
            addr: acceptor.addr(),
            frames,
            conns,
            acceptor,
        }
    }

    /// Cuts every open connection (the collector "crashes" but keeps listening).
    pub fn cut_connections(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Stops listening (the port is free when this returns) and cuts every connection.
    pub fn stop(&self) {
        self.acceptor.stop();
        self.cut_connections();
    }

    pub fn records(&self) -> Vec<hoptrace_protocol::Record> {
        self.frames
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(_, f)| match f {
                Frame::Records(r) | Frame::SeqRecords { records: r, .. } => Some(r.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// Waits until the exporter's goodbye frame has been read: every frame before it is in.
    pub fn wait_for_goodbye(&self) {
        self.wait_for("goodbye", Duration::from_secs(5), |f| {
            f.iter().any(|(_, f)| *f == Frame::Goodbye)
        });
    }

    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&[(usize, Frame)]) -> bool,
    ) {
        hoptrace_testkit::wait_for(what, timeout, || pred(&self.frames.lock().unwrap()));
    }
}

/// The `reject` of [`MiniCollector::version_1_only`].
const V1_ONLY: &str = "version 1 only";

fn serve(
    mut stream: TcpStream,
    id: usize,
    frames: &Received,
    reject: Option<&'static str>,
    durable: Option<Durable>,
) {
    let Ok(hello) = protocol::read_frame(&mut stream, MAX_FRAME_LEN) else {
        return;
    };
    let version = match &hello {
        Frame::Hello(h) => h.version,
        _ => 0,
    };
    frames.lock().unwrap().push((id, hello));
    // A version 1 collector: rejects what it does not speak, takes the rest.
    let reject = match reject {
        Some(V1_ONLY) if version <= 1 => None,
        other => other,
    };
    let answer = match reject {
        Some(V1_ONLY) => Frame::Reject {
            code: protocol::reject_code::VERSION,
            reason: format!(
                "unsupported protocol version {version}; this collector speaks protocol 1"
            ),
        },
        Some(reason) => Frame::Reject {
            code: protocol::reject_code::TOKEN,
            reason: reason.into(),
        },
        None => Frame::Welcome {
            // As a collector does: the lower of the probe's version and its own.
            version: version.min(if durable.is_some() { 2 } else { 1 }),
            run_id: "test-run".into(),
            resume_seq: durable
                .as_ref()
                .map_or(0, |d| d.resume.load(Ordering::Relaxed)),
        },
    };
    if stream.write_all(&answer.to_bytes().unwrap()).is_err() || reject.is_some() {
        return;
    }
    let mut writer = stream.try_clone().unwrap();
    while let Ok(frame) = protocol::read_frame(&mut stream, MAX_FRAME_LEN) {
        if let (Frame::SeqRecords { seq, .. }, Some(d)) = (&frame, &durable)
            && d.ack.load(Ordering::Relaxed)
        {
            let ack = Frame::Ack { seq: *seq }.to_bytes().unwrap();
            let _ = writer.write_all(&ack);
        }
        let goodbye = frame == Frame::Goodbye;
        frames.lock().unwrap().push((id, frame));
        if goodbye && durable.is_some() {
            // As a collector with a log does: the end of the connection once what it sent
            // is durable (here, at once).
            return;
        }
    }
}
