//! TLS settings for [`ConnectOptions`](crate::ConnectOptions): which CAs to trust and which
//! client certificate to present, turned into fred's `TlsConfig` (rustls with the ring
//! provider). Only with the `tls-rustls` feature.

use crate::error::{Error, Result};
use fred::types::config::{TlsConfig, TlsConnector, TlsHostMapping};
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use std::path::PathBuf;
use std::sync::Arc;

/// PEM given as bytes, or a file to read it from when connecting.
#[derive(Clone)]
enum Pem {
    Bytes(Arc<[u8]>),
    File(PathBuf),
}

impl Pem {
    /// The PEM text; `field` names the option in errors.
    fn read(&self, field: &'static str) -> Result<Vec<u8>> {
        match self {
            Pem::Bytes(b) => Ok(b.to_vec()),
            Pem::File(path) => std::fs::read(path).map_err(|e| {
                Error::invalid_setting(
                    field,
                    format!("{:?}: {e}", path.display().to_string()),
                    "cannot be read",
                )
            }),
        }
    }

    /// How errors show it: the path, or only the size (a key's bytes never print).
    fn shown(&self) -> String {
        match self {
            Pem::Bytes(b) => format!("<{} bytes of PEM>", b.len()),
            Pem::File(path) => format!("{:?}", path.display().to_string()),
        }
    }

    /// How `Debug` shows it; `secret` hides even the size.
    fn debug(&self, secret: bool) -> String {
        match self {
            Pem::Bytes(_) if secret => "<PEM, redacted>".into(),
            Pem::Bytes(b) => format!("<{} bytes of PEM>", b.len()),
            Pem::File(path) => format!("file {:?}", path.display().to_string()),
        }
    }
}

/// TLS settings for a `rediss://` connection: the CAs to trust and, for servers that ask
/// for one (`tls-auth-clients yes`), the client certificate to present.
///
/// Give it to [`ConnectOptions::with_tls`](crate::ConnectOptions::with_tls), or turn it into
/// fred's own TLS config with [`fred_config`](Self::fred_config) for a client you build
/// yourself. The same settings serve the locker's client and the subscriber connection of a
/// queued locker ([`Locker<Queue>`](crate::Locker)). Files are read and PEM is parsed when connecting;
/// `Debug` never shows a private key. Only with the `tls-rustls` feature.
///
/// # Examples
/// ```no_run
/// # async fn example() -> waitlock::Result<()> {
/// use waitlock::{ConnectOptions, Locker, TlsOptions};
/// let tls = TlsOptions::new()
///     .with_ca_file("/etc/redis/ca.pem")
///     .with_client_cert_files("/etc/redis/client.pem", "/etc/redis/client.key");
/// let locker = Locker::connect_with("rediss://redis.internal:6380", &ConnectOptions::new().with_tls(tls))
///     .await?
///     .queued().build()
///     .await?;
/// # let _ = locker; Ok(()) }
/// ```
#[derive(Clone, Default)]
#[must_use]
#[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
pub struct TlsOptions {
    ca: Option<Pem>,
    client: Option<(Pem, Pem)>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ca = self
            .ca
            .as_ref()
            .map_or_else(|| "the system's trust store".into(), |p| p.debug(false));
        let mut d = f.debug_struct("TlsOptions");
        d.field("ca", &ca);
        match &self.client {
            Some((cert, key)) => d
                .field("client_cert", &cert.debug(false))
                .field("client_key", &key.debug(true)),
            None => d.field("client_cert", &"none"),
        };
        d.finish()
    }
}

impl TlsOptions {
    /// Trusts the system's CA certificates and presents no client certificate.
    pub fn new() -> TlsOptions {
        TlsOptions::default()
    }

    /// Trusts only the CA certificates in `pem` (one or more `BEGIN CERTIFICATE` blocks), e.g.
    /// a private CA. Defaults to the system's trust store.
    pub fn with_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(Pem::Bytes(pem.into().into()));
        self
    }

    /// As [`with_ca_pem`](Self::with_ca_pem), read from the file at `path` when connecting.
    /// Defaults to the system's trust store.
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(Pem::File(path.into()));
        self
    }

    /// Presents a client certificate, for servers with `tls-auth-clients yes`: `cert_chain` is
    /// the certificate (then any intermediates) in PEM, `key` its private key in PEM (PKCS#8,
    /// PKCS#1 or SEC1). Defaults to no client certificate.
    pub fn with_client_cert_pem(
        mut self,
        cert_chain: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.client = Some((
            Pem::Bytes(cert_chain.into().into()),
            Pem::Bytes(key.into().into()),
        ));
        self
    }

    /// As [`with_client_cert_pem`](Self::with_client_cert_pem), read from the files at
    /// `cert_chain` and `key` when connecting. Defaults to no client certificate.
    pub fn with_client_cert_files(
        mut self,
        cert_chain: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.client = Some((Pem::File(cert_chain.into()), Pem::File(key.into())));
        self
    }

    /// fred's TLS config for these settings (rustls with the ring crypto provider), for a
    /// client you build yourself:
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// use waitlock::fred::prelude::*;
    /// let mut config = Config::from_url("redis://redis.internal:6380")?; // TLS set below
    /// config.tls = Some(waitlock::TlsOptions::new().with_ca_file("ca.pem").fred_config()?);
    /// let client = Builder::from_config(config)
    ///     .set_policy(ReconnectPolicy::new_exponential(0, 10, 1000, 2))
    ///     .build()?;
    /// client.init().await?;
    /// let locker = waitlock::Locker::new(client);
    /// # let _ = locker; Ok(()) }
    /// ```
    ///
    /// Errors: [`Error::InvalidSetting`] naming the setting (`tls.ca`, `tls.client_cert`,
    /// `tls.client_key`) when a file cannot be read, holds no PEM of the right kind, or the
    /// key does not match the certificate; also when the system's trust store is empty and
    /// no CA was given.
    pub fn fred_config(&self) -> Result<TlsConfig> {
        let roots = self.roots()?;
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|_| Error::invalid_setting("tls", "ring", "no TLS version is available"))?
                .with_root_certificates(roots);
        let config = match &self.client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = certificates(cert, "tls.client_cert")?;
                let key_der =
                    PrivateKeyDer::from_pem_slice(&key.read("tls.client_key")?).map_err(|e| {
                        let reason = match e {
                            pem::Error::NoItemsFound => "holds no PEM private key",
                            _ => "is not valid PEM",
                        };
                        Error::invalid_setting("tls.client_key", key.shown(), reason)
                    })?;
                builder.with_client_auth_cert(chain, key_der).map_err(|_| {
                    Error::invalid_setting(
                        "tls.client_key",
                        key.shown(),
                        "does not match the client certificate, or its kind is not supported",
                    )
                })?
            }
        };
        Ok(TlsConfig {
            connector: TlsConnector::from(config),
            hostnames: TlsHostMapping::None,
        })
    }

    /// The CAs to trust: the given ones, or the system's.
    fn roots(&self) -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        match &self.ca {
            Some(ca) => {
                for cert in certificates(ca, "tls.ca")? {
                    roots.add(cert).map_err(|_| {
                        Error::invalid_setting(
                            "tls.ca",
                            ca.shown(),
                            "is not a usable CA certificate",
                        )
                    })?;
                }
            }
            None => {
                // Certificates the system store holds but rustls cannot parse are skipped, as
                // browsers do; only an empty result is an error.
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(Error::invalid_setting(
                        "tls.ca",
                        "the system's trust store",
                        "holds no CA certificate: give one with TlsOptions::with_ca_file",
                    ));
                }
            }
        }
        Ok(roots)
    }
}

/// Every certificate in `pem`; at least one.
fn certificates(pem: &Pem, field: &'static str) -> Result<Vec<CertificateDer<'static>>> {
    let text = pem.read(field)?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| Error::invalid_setting(field, pem.shown(), "is not valid PEM"))?;
    if certs.is_empty() {
        return Err(Error::invalid_setting(
            field,
            pem.shown(),
            "holds no PEM certificate",
        ));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(r: Result<TlsConfig>) -> &'static str {
        match r {
            Err(Error::InvalidSetting { field, .. }) => field,
            other => panic!("expected InvalidSetting, got {other:?}"),
        }
    }

    #[test]
    fn unreadable_and_invalid_pem_name_the_option() {
        let missing = TlsOptions::new().with_ca_file("/nonexistent/waitlock-ca.pem");
        let e = missing.fred_config().unwrap_err();
        assert!(e.to_string().contains("tls.ca"), "{e}");
        assert!(
            e.to_string().contains("/nonexistent/waitlock-ca.pem"),
            "{e}"
        );
        assert_eq!(
            field_of(TlsOptions::new().with_ca_pem("not pem").fred_config()),
            "tls.ca"
        );
        assert_eq!(
            field_of(
                TlsOptions::new()
                    .with_ca_pem("-----BEGIN CERTIFICATE-----\n%%%\n-----END CERTIFICATE-----\n")
                    .fred_config()
            ),
            "tls.ca"
        );
    }

    #[test]
    fn debug_never_shows_a_key() {
        let o = TlsOptions::new()
            .with_ca_pem("CA-BYTES")
            .with_client_cert_pem("CERT-BYTES", "KEY-SECRET");
        let shown = format!("{o:?}");
        assert!(!shown.contains("KEY-SECRET"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }
}
