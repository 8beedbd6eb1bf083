//! One HTTP answer of the agent's port: status, content type, extra
//! headers, body.

use std::sync::Arc;

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
    /// The body (not sent for HEAD); shared, so that requests for the same
    /// `/status` at once hold one copy.
    pub body: Arc<[u8]>,
}

/// `text/plain; charset=utf-8`.
pub const PLAIN: &str = "text/plain; charset=utf-8";

impl Answer {
    /// A plain-text answer.
    pub fn plain(status: u16, body: impl Into<String>) -> Answer {
        Answer::new(status, PLAIN, body.into().into_bytes())
    }

    /// An answer of `content_type` with `body`.
    pub fn new(status: u16, content_type: &'static str, body: Vec<u8>) -> Answer {
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

    /// The same answer with `body` as its body.
    pub(super) fn with_shared_body(mut self, body: Arc<[u8]>) -> Answer {
        self.body = body;
        self
    }

    /// The status line and headers, ending with the blank line.
    pub(super) fn head(&self) -> String {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        );
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        head
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}
