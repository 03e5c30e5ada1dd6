//! TLS to the collector (rustls, ring provider), behind the `tls` feature: the exporter
//! verifies the collector's certificate against a CA bundle (PEM). The same framing runs
//! inside the TLS stream (`docs/collector-protocol.md`).

use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

/// A TLS setting that cannot be used, naming the file or value at fault.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct TlsError(String);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate of a PEM file.
///
/// # Errors
/// The file does not read, holds no certificate, or a certificate is malformed.
fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| TlsError(format!("certificates in {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(TlsError(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(certs)
}

/// A probe's TLS setting: the CA bundle the collector's certificate must chain to.
///
/// # Errors
/// The file does not read or a certificate in it is not a usable trust anchor.
pub(crate) fn client_config(ca: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(ca)? {
        roots
            .add(cert)
            .map_err(|e| TlsError(format!("CA certificate in {}: {e}", ca.display())))?;
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("TLS protocol versions: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The name the collector's certificate must carry: `name` when given, else the host part
/// of `addr` (`host:port`, `[v6]:port`), an IP address or a DNS name.
///
/// # Errors
/// The name is neither an IP address nor a valid DNS name.
pub(crate) fn server_name(addr: &str, name: Option<&str>) -> Result<ServerName<'static>, TlsError> {
    let host = name.unwrap_or_else(|| {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        host.trim_start_matches('[').trim_end_matches(']')
    });
    ServerName::try_from(host.to_owned())
        .map_err(|e| TlsError(format!("TLS server name {host:?} (from {addr:?}): {e}")))
}

/// Wraps `tcp` in TLS towards `name` and completes the handshake (bounded by the
/// socket's timeouts).
pub(crate) fn connect(
    config: &Arc<ClientConfig>,
    name: ServerName<'static>,
    mut tcp: TcpStream,
) -> Result<rustls::StreamOwned<ClientConnection, TcpStream>, String> {
    let mut conn =
        ClientConnection::new(Arc::clone(config), name).map_err(|e| format!("TLS setup: {e}"))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                "TLS handshake: the collector did not answer within connect_timeout".to_owned()
            }
            _ => format!("TLS handshake: {e}"),
        })?;
    }
    Ok(rustls::StreamOwned::new(conn, tcp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_name_comes_from_the_address_or_the_override() {
        assert_eq!(
            server_name("10.0.0.1:7400", None).unwrap(),
            ServerName::try_from("10.0.0.1").unwrap()
        );
        assert_eq!(
            server_name("[::1]:7400", None).unwrap(),
            ServerName::try_from("::1").unwrap()
        );
        assert_eq!(
            server_name("collector.lab:7400", None).unwrap(),
            ServerName::try_from("collector.lab").unwrap()
        );
        assert_eq!(
            server_name("10.0.0.1:7400", Some("collector.lab")).unwrap(),
            ServerName::try_from("collector.lab").unwrap()
        );
        let err = server_name("bad name!:7400", None).unwrap_err().to_string();
        assert!(err.contains("bad name!"), "{err}");
    }

    #[test]
    fn missing_and_empty_files_are_named() {
        let dir = std::env::temp_dir().join(format!("hoptrace-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a pem file\n").unwrap();
        let err = client_config(&empty).unwrap_err().to_string();
        assert!(err.contains("empty.pem") && err.contains("no PEM"), "{err}");
        let missing = dir.join("missing.pem");
        let err = client_config(&missing).unwrap_err().to_string();
        assert!(err.contains("missing.pem"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
