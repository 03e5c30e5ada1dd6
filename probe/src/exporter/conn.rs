//! An exporter's connection to the collector: plain TCP or TLS, resolved once at start.

use std::io::{Read, Write};
use std::net::TcpStream;
#[cfg(feature = "tls")]
use std::sync::Arc;

use super::config::{ExporterConfig, ExporterError};

/// The TLS setting an exporter connects with, resolved once at start.
pub(super) struct Tls {
    #[cfg(feature = "tls")]
    pub(super) client: Option<(
        Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    )>,
}

impl Tls {
    #[cfg(feature = "tls")]
    pub(super) fn new(config: &ExporterConfig) -> Result<Self, ExporterError> {
        let client = match &config.tls_ca {
            Some(ca) => Some((
                crate::tls::client_config(ca).map_err(|e| ExporterError::Tls(e.to_string()))?,
                crate::tls::server_name(&config.collector, config.tls_server_name.as_deref())
                    .map_err(|e| ExporterError::Tls(e.to_string()))?,
            )),
            None => None,
        };
        Ok(Self { client })
    }

    #[cfg(not(feature = "tls"))]
    pub(super) fn new(config: &ExporterConfig) -> Result<Self, ExporterError> {
        match &config.tls_ca {
            Some(ca) => Err(ExporterError::Tls(format!(
                "TLS to the collector (CA {}) needs hoptrace-probe built with the `tls` feature",
                ca.display()
            ))),
            None => Ok(Self {}),
        }
    }

    pub(super) fn wrap(&self, tcp: TcpStream) -> Result<Conn, String> {
        #[cfg(feature = "tls")]
        if let Some((config, name)) = &self.client {
            return crate::tls::connect(config, name.clone(), tcp).map(|s| Conn::Tls(Box::new(s)));
        }
        Ok(Conn::Plain(tcp))
    }
}

/// The connection to the collector: plain TCP, or TLS over it.
pub(super) enum Conn {
    Plain(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Conn {
    /// Switches the socket between blocking and non-blocking.
    pub(super) fn set_nonblocking(&self, on: bool) {
        let _ = match self {
            Self::Plain(s) => s.set_nonblocking(on),
            #[cfg(feature = "tls")]
            Self::Tls(s) => s.sock.set_nonblocking(on),
        };
    }

    /// Flushes, sends TLS close_notify when TLS, and shuts the write side.
    pub(super) fn finish(&mut self) {
        let _ = self.flush();
        match self {
            Self::Plain(s) => {
                let _ = s.shutdown(std::net::Shutdown::Write);
            }
            #[cfg(feature = "tls")]
            Self::Tls(s) => {
                s.conn.send_close_notify();
                let _ = s.flush();
                let _ = s.sock.shutdown(std::net::Shutdown::Write);
            }
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Plain(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Self::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Plain(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Self::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Plain(s) => s.flush(),
            #[cfg(feature = "tls")]
            Self::Tls(s) => s.flush(),
        }
    }
}
