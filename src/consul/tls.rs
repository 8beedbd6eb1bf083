//! TLS to Consul: the CA file, client certificate and server name of the
//! `--consul-*` TLS options (or the Consul CLI's variables) loaded once into
//! a rustls client configuration that every Consul client shares, and a
//! failed request's TLS error told apart from other transport errors.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::cli::{bad, ConfigError};

/// A file named by a TLS option, with the option or variable it came from
/// (named in errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFile {
    /// The path given.
    pub path: PathBuf,
    /// `--consul-ca-file`, `$CONSUL_CACERT`, ...
    pub from: &'static str,
}

/// The TLS options, as given: nothing is read until [`TlsSettings::load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM file of the CA certificates that sign Consul's HTTPS
    /// certificate; they replace the system's roots (as `consul -ca-file`
    /// does). Default: the system's roots.
    pub ca_file: Option<TlsFile>,
    /// PEM client certificate (chain), for a Consul with
    /// `verify_incoming` (or `verify_incoming_https`). Default: none.
    pub client_cert: Option<TlsFile>,
    /// PEM private key of `client_cert` (PKCS#8, PKCS#1 or SEC1).
    pub client_key: Option<TlsFile>,
    /// The name Consul's certificate is checked against instead of the
    /// address's host (as Go's `tls.Config.ServerName`, e.g.
    /// `server.dc1.consul`). Default: the host of each address.
    pub server_name: Option<String>,
    /// Verify Consul's certificate (chain and name). Default: true; false
    /// is `CONSUL_HTTP_SSL_VERIFY=false`: any certificate is taken.
    pub verify: bool,
}

impl Default for TlsSettings {
    fn default() -> Self {
        TlsSettings {
            ca_file: None,
            client_cert: None,
            client_key: None,
            server_name: None,
            verify: true,
        }
    }
}

/// The loaded TLS configuration every Consul client is built with: `None`
/// when no TLS option is set (an `https://` address then uses reqwest's
/// rustls defaults: the system's roots, the address's host).
#[derive(Clone, Default)]
pub struct Tls(Option<Arc<rustls::ClientConfig>>);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Tls(configured)"
        } else {
            "Tls(default)"
        })
    }
}

/// Equal when both are the default or share one loaded configuration.
impl PartialEq for Tls {
    fn eq(&self, other: &Tls) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Tls {}

impl Tls {
    /// `builder` with this TLS configuration, for a client of `addr`; an
    /// `https://` address's client refuses any `http://` URL (no redirect
    /// or fallback can leave TLS).
    pub(crate) fn apply(
        &self,
        addr: &str,
        builder: reqwest::ClientBuilder,
    ) -> reqwest::ClientBuilder {
        let https = addr.starts_with("https://");
        let builder = builder.https_only(https);
        match (&self.0, https) {
            (Some(config), _) => builder.tls_backend_preconfigured(config.as_ref().clone()),
            (None, true) => builder,
            (None, false) => builder.tls_backend_preconfigured(plain_http().as_ref().clone()),
        }
    }
}

/// The TLS configuration of a client for a plain `http://` address: it
/// never speaks TLS (a redirect to `https://` is refused at the first
/// certificate), so it reads no system roots, and an agent on a host or in
/// an image without CA certificates (a minimal Debian, `FROM scratch`)
/// starts. reqwest's default would load the system's roots and fail to
/// build the client without any.
fn plain_http() -> &'static Arc<rustls::ClientConfig> {
    static CONFIG: std::sync::OnceLock<Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();
    CONFIG.get_or_init(|| {
        let provider = default_provider();
        let verifier = Arc::new(AnyCertificate {
            provider: provider.clone(),
            refuse: true,
        });
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("the default provider supports the default protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Arc::new(config)
    })
}

/// The process's default crypto provider, else aws-lc-rs's.
fn default_provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
}

impl TlsSettings {
    /// Reads the files and builds the client configuration; with no option
    /// set, reads nothing ([`Tls::default`]).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the option (or variable) whose file cannot be
    /// read or holds no usable certificate or key, a client certificate
    /// without its key (or a key without its certificate), or a server name
    /// that is not a DNS name or IP address.
    pub fn load(&self) -> Result<Tls, ConfigError> {
        if *self == TlsSettings::default() {
            return Ok(Tls::default());
        }
        let provider = default_provider();
        let verifier: Arc<dyn ServerCertVerifier> = if !self.verify {
            Arc::new(AnyCertificate {
                provider: provider.clone(),
                refuse: false,
            })
        } else {
            let roots: Arc<dyn ServerCertVerifier> = match &self.ca_file {
                Some(file) => {
                    let mut store = RootCertStore::empty();
                    for cert in certificates(file)? {
                        store
                            .add(cert)
                            .map_err(|e| bad(file.from, file.path.display(), e))?;
                    }
                    WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
                        .build()
                        .map_err(|e| bad(file.from, file.path.display(), e))?
                }
                None => Arc::new(
                    rustls_platform_verifier::Verifier::new(provider.clone()).map_err(|e| {
                        bad("--consul-ca-file", "", format!("no system roots: {e}"))
                    })?,
                ),
            };
            match &self.server_name {
                Some(name) => Arc::new(CheckedAs {
                    name: ServerName::try_from(name.clone())
                        .map_err(|e| bad("--consul-tls-server-name", name, e.to_string()))?,
                    inner: roots,
                }),
                None => roots,
            }
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("--consul-ca-file", "", e))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&self.client_cert, &self.client_key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = certificates(cert)?;
                let der = PrivateKeyDer::from_pem_slice(&read(key)?)
                    .map_err(|e| bad(key.from, key.path.display(), pem_reason("a key", e)))?;
                builder
                    .with_client_auth_cert(chain, der)
                    .map_err(|e| bad(key.from, key.path.display(), e))?
            }
            (Some(file), None) => {
                return Err(bad(
                    file.from,
                    file.path.display(),
                    "a client certificate needs its key (--consul-client-key)",
                ))
            }
            (None, Some(file)) => {
                return Err(bad(
                    file.from,
                    file.path.display(),
                    "a client key needs its certificate (--consul-client-cert)",
                ))
            }
        };
        Ok(Tls(Some(Arc::new(config))))
    }
}

fn read(file: &TlsFile) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(&file.path).map_err(|e| bad(file.from, file.path.display(), e))
}

fn pem_reason(what: &str, e: rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::NoItemsFound => format!("no PEM {what} in it"),
        e => format!("not PEM {what}: {e:?}"),
    }
}

/// Every PEM certificate in `file`: at least one.
fn certificates(file: &TlsFile) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let bytes = read(file)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(file.from, file.path.display(), pem_reason("certificate", e)))?;
    if certs.is_empty() {
        return Err(bad(
            file.from,
            file.path.display(),
            "no PEM certificate in it",
        ));
    }
    Ok(certs)
}

/// Checks the certificate against the configured server name rather than
/// the address's host (Go's `tls.Config.ServerName`, which the Consul CLI
/// sets from `-tls-server-name`); everything else is `inner`'s.
#[derive(Debug)]
struct CheckedAs {
    name: ServerName<'static>,
    inner: Arc<dyn ServerCertVerifier>,
}

impl ServerCertVerifier for CheckedAs {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// `CONSUL_HTTP_SSL_VERIFY=false`: any certificate is taken (Go's
/// `InsecureSkipVerify`); the handshake's signatures are still checked.
/// With `refuse`, for a plain `http://` client, every certificate is
/// refused instead, without a root store to read.
#[derive(Debug)]
struct AnyCertificate {
    provider: Arc<CryptoProvider>,
    refuse: bool,
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.refuse {
            return Err(rustls::Error::General(
                "a client for a plain http:// Consul address speaks no TLS".into(),
            ));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The TLS failure in a transport error's chain, said with what to check:
/// `None` when the failure is not TLS's. rustls's error travels inside an
/// `io::Error` (itself inside another one on connect: `Other` around
/// `InvalidData`), whose `source()` skips it, so each link's inner errors
/// are looked at too.
pub(crate) fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut link = Some(e);
    for _ in 0..16 {
        let e = link?;
        let mut inner: Option<&(dyn std::error::Error + 'static)> = Some(e);
        for _ in 0..4 {
            let Some(i) = inner else { break };
            if let Some(tls) = i.downcast_ref::<rustls::Error>() {
                return Some(describe(tls));
            }
            inner = i
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .map(|i| i as &(dyn std::error::Error + 'static));
        }
        link = e.source();
    }
    None
}

fn describe(e: &rustls::Error) -> String {
    use rustls::AlertDescription as A;
    let hint = match e {
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => "its certificate is not for this name (check --consul-tls-server-name)",
        rustls::Error::InvalidCertificate(_) => {
            "its certificate is not trusted (check --consul-ca-file)"
        }
        rustls::Error::AlertReceived(
            A::BadCertificate
            | A::CertificateRequired
            | A::UnknownCA
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateExpired
            | A::AccessDenied,
        ) => {
            "it refused our client certificate (check --consul-client-cert and --consul-client-key)"
        }
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "is it serving HTTPS on this port?"
        }
        _ => "",
    };
    if hint.is_empty() {
        e.to_string()
    } else {
        format!("{e}: {hint}")
    }
}

/// A TLS file option's value (`from` names it), unless unset or empty.
pub(crate) fn file(path: Option<&Path>, from: &'static str) -> Option<TlsFile> {
    path.filter(|p| !p.as_os_str().is_empty()).map(|p| TlsFile {
        path: p.to_path_buf(),
        from,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(path: &Path, from: &'static str) -> Option<TlsFile> {
        file(Some(path), from)
    }

    #[test]
    fn no_option_reads_nothing() {
        assert!(TlsSettings::default().load().unwrap().0.is_none());
    }

    #[test]
    fn bad_files_name_the_option_they_came_from() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        for (settings, option, reason) in [
            (
                TlsSettings {
                    ca_file: named(&missing, "$CONSUL_CACERT"),
                    ..TlsSettings::default()
                },
                "$CONSUL_CACERT",
                "No such file",
            ),
            (
                TlsSettings {
                    ca_file: named(&junk, "--consul-ca-file"),
                    ..TlsSettings::default()
                },
                "--consul-ca-file",
                "no PEM certificate",
            ),
            (
                TlsSettings {
                    client_cert: named(&junk, "--consul-client-cert"),
                    ..TlsSettings::default()
                },
                "--consul-client-cert",
                "needs its key",
            ),
            (
                TlsSettings {
                    server_name: Some("not a name!".into()),
                    ..TlsSettings::default()
                },
                "--consul-tls-server-name",
                "",
            ),
        ] {
            let e = settings.load().unwrap_err();
            assert_eq!(e.option, option, "{e}");
            assert!(e.to_string().contains(reason), "{e}");
        }
    }

    #[test]
    fn verification_off_loads_without_files() {
        let off = TlsSettings {
            verify: false,
            ..TlsSettings::default()
        };
        assert!(off.load().unwrap().0.is_some());
    }
}
