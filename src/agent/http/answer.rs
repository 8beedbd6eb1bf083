//! One HTTP answer of the agent's port: status, content type, extra
//! headers, body; and the hyper response it becomes.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue, CONNECTION, CONTENT_TYPE};
use hyper::{Response, StatusCode};

/// One answer: status, content type, extra headers, body. Always sent with
/// `Content-Length` and `Connection: close`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The `Content-Type`.
    pub content_type: &'static str,
    /// Extra headers, e.g. `Retry-After`.
    pub headers: Vec<(&'static str, String)>,
    /// The body (not sent for HEAD); reference-counted, so that requests
    /// for the same `/status` at once hold one copy.
    pub body: Bytes,
}

/// `text/plain; charset=utf-8`.
pub const PLAIN: &str = "text/plain; charset=utf-8";

impl Answer {
    /// A plain-text answer.
    pub fn plain(status: u16, body: impl Into<String>) -> Answer {
        Answer::new(status, PLAIN, body.into())
    }

    /// An answer of `content_type` with `body`.
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Bytes>) -> Answer {
        Answer {
            status,
            content_type,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// The same answer with one more header.
    pub fn with_header(mut self, name: &'static str, value: String) -> Answer {
        self.headers.push((name, value));
        self
    }

    /// The hyper response: hyper adds `Content-Length` from the body and
    /// leaves the body out for HEAD.
    pub fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(self.body));
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(self.content_type));
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
        for (name, value) in self.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                headers.insert(name, value);
            }
        }
        response
    }
}
