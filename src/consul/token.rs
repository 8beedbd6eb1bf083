//! The Consul ACL token: read from a file on first use and again on demand
//! (a 403 or SIGHUP), or given once as a value; sent only as
//! `X-Consul-Token` and never logged.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use reqwest::header::HeaderValue;

use super::types::ConsulError;

/// Reads the ACL token from a file on first use and again after
/// [`TokenSource::invalidate`] (on a 403 or SIGHUP), so a rotated token needs
/// no restart. The token is never logged.
#[derive(Debug)]
pub struct TokenSource {
    path: Option<PathBuf>,
    fixed: Option<HeaderValue>,
    cached: Mutex<Option<Option<HeaderValue>>>,
    /// How many times the token was read from its file.
    loads: AtomicU64,
}

impl TokenSource {
    /// A token read from `path`, or no token when `None`.
    pub fn new(path: Option<PathBuf>) -> Self {
        TokenSource {
            path,
            fixed: None,
            cached: Mutex::new(None),
            loads: AtomicU64::new(0),
        }
    }

    /// A token given as a value (the writer CLI's `$CONSUL_HTTP_TOKEN`, as
    /// the `consul` CLI reads it); never re-read. An empty value means no
    /// token.
    ///
    /// # Errors
    ///
    /// [`ConsulError::Token`] when the value has characters not allowed in
    /// an HTTP header.
    pub fn from_value(token: &str, origin: &str) -> Result<Self, ConsulError> {
        let token = token.trim();
        let fixed = if token.is_empty() {
            None
        } else {
            let mut value = HeaderValue::from_str(token).map_err(|_| ConsulError::Token {
                path: PathBuf::from(origin),
                detail: "token has characters not allowed in an HTTP header".into(),
            })?;
            value.set_sensitive(true);
            Some(value)
        };
        Ok(TokenSource {
            path: None,
            fixed,
            cached: Mutex::new(None),
            loads: AtomicU64::new(0),
        })
    }

    /// The token file, if any.
    pub fn path(&self) -> Option<&PathBuf> {
        self.path.as_ref()
    }

    /// Drops the cached token so the next request re-reads the file.
    pub fn invalidate(&self) {
        *self.cached.lock().unwrap() = None;
    }

    /// How many times the token has been read from its file (0 for a fixed
    /// token or none): a change means requests now carry another token.
    pub fn loads(&self) -> u64 {
        self.loads.load(Ordering::SeqCst)
    }

    pub(crate) fn header(&self) -> Result<Option<HeaderValue>, ConsulError> {
        if self.fixed.is_some() {
            return Ok(self.fixed.clone());
        }
        let mut cached = self.cached.lock().unwrap();
        if let Some(h) = cached.as_ref() {
            return Ok(h.clone());
        }
        self.loads.fetch_add(1, Ordering::SeqCst);
        let header = match &self.path {
            None => None,
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConsulError::Token {
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
                if text.trim().is_empty() {
                    // An empty file (as the package installs it) means no
                    // token: Consul's anonymous token applies.
                    *cached = Some(None);
                    return Ok(None);
                }
                let mut value =
                    HeaderValue::from_str(text.trim()).map_err(|_| ConsulError::Token {
                        path: path.clone(),
                        detail: "token has characters not allowed in an HTTP header".into(),
                    })?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        *cached = Some(header.clone());
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_is_trimmed_reread_after_invalidate_and_empty_means_none() {
        let path = std::env::temp_dir().join(format!("gha-token-{}", std::process::id()));
        std::fs::write(&path, "").unwrap();
        let source = TokenSource::new(Some(path.clone()));
        assert_eq!(source.header().unwrap(), None);
        std::fs::write(&path, "s3cret\n").unwrap();
        // Cached until invalidated.
        assert_eq!(source.header().unwrap(), None);
        source.invalidate();
        let header = source.header().unwrap().unwrap();
        assert_eq!(header.to_str().unwrap(), "s3cret");
        assert!(header.is_sensitive());
        std::fs::remove_file(&path).unwrap();
        source.invalidate();
        assert!(matches!(source.header(), Err(ConsulError::Token { .. })));
    }

    #[test]
    fn token_given_as_a_value_is_sent_and_empty_means_none() {
        let source = TokenSource::from_value(" abc \n", "CONSUL_HTTP_TOKEN").unwrap();
        assert_eq!(source.header().unwrap().unwrap().to_str().unwrap(), "abc");
        source.invalidate();
        assert!(source.header().unwrap().is_some());
        assert_eq!(
            TokenSource::from_value("", "x").unwrap().header().unwrap(),
            None
        );
        assert!(TokenSource::from_value("a\u{7f}b", "x").is_err());
    }
}
