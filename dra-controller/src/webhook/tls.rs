//! The serving certificate: PEM files (a Secret's `tls.crt` / `tls.key`, mounted), read at start
//! and read again whenever their bytes change, so a renewed Secret (cert-manager, or by hand) is
//! served without a restart. New handshakes get the new key; open connections keep theirs.
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};
use tracing::{info, warn};

use crate::controller::{Error, Result};

/// How often the files are compared with what is served. The kubelet updates a mounted Secret
/// within about a minute, so a few seconds more is not noticed.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// The certificate and key files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn tls_err(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Tls(format!("{}: {reason}", path.display()))
}

impl CertFiles {
    /// Both files' bytes, compared to decide whether to parse again.
    async fn read(&self) -> Result<(Vec<u8>, Vec<u8>)> {
        let cert = tokio::fs::read(&self.cert)
            .await
            .map_err(|e| tls_err(&self.cert, e))?;
        let key = tokio::fs::read(&self.key)
            .await
            .map_err(|e| tls_err(&self.key, e))?;
        Ok((cert, key))
    }

    fn parse(&self, cert: &[u8], key: &[u8], provider: &CryptoProvider) -> Result<CertifiedKey> {
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| tls_err(&self.cert, e))?;
        if chain.is_empty() {
            return Err(tls_err(&self.cert, "no PEM certificate in the file"));
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| tls_err(&self.key, e))?;
        CertifiedKey::from_der(chain, key, provider).map_err(|e| tls_err(&self.key, e))
    }
}

/// The certificate served now, swapped by [`Reloader::watch`].
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// Loads the files, builds the server config, and keeps the served key in step with the files.
pub struct Reloader {
    files: CertFiles,
    provider: Arc<CryptoProvider>,
    current: Arc<Current>,
    seen: (Vec<u8>, Vec<u8>),
}

impl Reloader {
    /// Fails when the files are missing or unusable: a webhook without a key cannot serve at all.
    pub async fn load(files: CertFiles) -> Result<Self> {
        let provider = Arc::new(ring::default_provider());
        let seen = files.read().await?;
        let key = files.parse(&seen.0, &seen.1, &provider)?;
        Ok(Reloader {
            files,
            provider,
            current: Arc::new(Current(RwLock::new(Arc::new(key)))),
            seen,
        })
    }

    /// TLS 1.2 and 1.3 with ring, HTTP/1.1 only (the API server speaks it to webhooks).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e: rustls::Error| Error::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(self.current.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Compares the files with what is served once; a changed pair that does not parse is logged
    /// and the old key kept, since a half-written Secret update is followed by the whole one.
    pub async fn check(&mut self) -> bool {
        let fresh = match self.files.read().await {
            Ok(fresh) if fresh != self.seen => fresh,
            Ok(_) => return false,
            Err(e) => {
                warn!(error = %e, "reading the webhook certificate failed; serving the old one");
                return false;
            }
        };
        match self.files.parse(&fresh.0, &fresh.1, &self.provider) {
            Ok(key) => {
                *self.current.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
                self.seen = fresh;
                info!(cert = %self.files.cert.display(), "webhook certificate reloaded");
                true
            }
            Err(e) => {
                warn!(error = %e, "the changed webhook certificate is unusable; serving the old one");
                false
            }
        }
    }

    /// Runs [`Reloader::check`] every [`RELOAD_EVERY`] until dropped.
    pub async fn watch(mut self) {
        let mut tick = tokio::time::interval(RELOAD_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.check().await;
        }
    }
}
