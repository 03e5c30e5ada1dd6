//! The collector's TLS: its certificate chain and key (PEM) served with rustls (ring
//! provider). The same framing runs inside the TLS stream (`docs/collector-protocol.md`);
//! probes verify the certificate against the CA bundle they are given.

use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The collector's TLS setting: its certificate chain and key.
///
/// # Errors
/// A message naming the file at fault: it does not read, holds no certificate or key, or
/// the key does not match the certificate.
pub(crate) fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| format!("certificates in {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            cert.display()
        ));
    }
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("private key in {}: {e}", key.display()))?;
    let config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS protocol versions: {e}"))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| {
                format!(
                    "certificate {} with key {}: {e}",
                    cert.display(),
                    key.display()
                )
            })?;
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_empty_files_are_named() {
        let dir =
            std::env::temp_dir().join(format!("hoptrace-collector-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a pem file\n").unwrap();
        let missing = dir.join("missing.pem");
        let err = server_config(&missing, &missing).unwrap_err();
        assert!(err.contains("missing.pem"), "{err}");
        let err = server_config(&empty, &empty).unwrap_err();
        assert!(err.contains("empty.pem") && err.contains("no PEM"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A connection: plain, or TLS over it (the probes' and the OTLP receiver's).
#[derive(Debug)]
pub(crate) enum MaybeTls<S: std::io::Read + std::io::Write> {
    Plain(S),
    Tls(Box<rustls::StreamOwned<rustls::ServerConnection, S>>),
}

impl<S: std::io::Read + std::io::Write> MaybeTls<S> {
    /// The socket under it.
    pub(crate) fn sock(&mut self) -> &mut S {
        match self {
            Self::Plain(s) => s,
            Self::Tls(s) => &mut s.sock,
        }
    }
}

impl<S: std::io::Read + std::io::Write> std::io::Read for MaybeTls<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Plain(s) => s.read(buf),
            Self::Tls(s) => s.read(buf),
        }
    }
}

impl<S: std::io::Read + std::io::Write> std::io::Write for MaybeTls<S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Plain(s) => s.write(buf),
            Self::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Plain(s) => s.flush(),
            Self::Tls(s) => s.flush(),
        }
    }
}
