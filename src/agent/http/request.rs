//! The HTTP port's request reader: reads one HTTP/1.x request head within
//! a deadline and parses it, or says which error status refuses it. The
//! port serves a handful of GET endpoints, so it takes only what they need:
//! no bodies, no keep-alive, no absolute-form targets.

use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

/// Largest request head accepted (request line and headers): 8 KiB. A
/// kubelet probe or a Prometheus scrape sends a few hundred bytes; a larger
/// head is answered 431.
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// The request method, as far as the port cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `HEAD`: answered as GET, without the body.
    Head,
    /// Any other method token: answered 405.
    Other(String),
}

/// A request head that parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The method.
    pub method: Method,
    /// The path of the origin-form target, before any `?`; starts with `/`.
    pub path: String,
    /// The query after the first `?`, if any (not decoded).
    pub query: Option<String>,
}

impl Request {
    /// Whether this is a probe (`/-/ready`, `/-/healthy`, `/-/answering`),
    /// which is served from a slot kept for probes.
    pub fn is_probe(&self) -> bool {
        matches!(self.method, Method::Get | Method::Head)
            && matches!(
                self.path.as_str(),
                "/-/ready" | "/-/healthy" | "/-/answering"
            )
    }
}

/// Why a request was refused, with the status it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// 400, 413, 431 or 505.
    pub status: u16,
    /// What was wrong, sent as the plain-text body.
    pub reason: &'static str,
}

impl Refusal {
    const fn bad(reason: &'static str) -> Refusal {
        Refusal {
            status: 400,
            reason,
        }
    }
}

/// How reading a request ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// A whole head that parsed.
    Request(Request),
    /// A whole head (or too much of one) that is refused.
    Refused(Refusal),
    /// No whole head within the time, or the client closed first, or the
    /// connection failed: closed without an answer.
    Incomplete,
}

/// Reads one request head from `stream` within `timeout` (for the whole
/// head, however it trickles in) and parses it. Bytes after the head are
/// left unread.
pub async fn read(stream: &mut TcpStream, timeout: Duration) -> Read {
    let mut buf = Vec::with_capacity(1024);
    let reading = async {
        let mut chunk = [0u8; 1024];
        loop {
            let n = match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return Read::Incomplete,
                Ok(n) => n,
            };
            // Look for the end only where it can be: from three bytes
            // before the new data.
            let from = buf.len().saturating_sub(3);
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = head_end(&buf[from..]) {
                return parse(&buf[..from + end]);
            }
            if buf.len() >= MAX_REQUEST_HEAD {
                return Read::Refused(TOO_LARGE);
            }
        }
    };
    tokio::time::timeout(timeout, reading)
        .await
        .unwrap_or(Read::Incomplete)
}

const TOO_LARGE: Refusal = Refusal {
    status: 431,
    reason: "request head larger than 8 KiB",
};

/// The length of the head in `buf` up to and including the blank line that
/// ends it (CRLF CRLF, or bare LFs as RFC 9112 allows), if it is there.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(pos) = buf[i..].iter().position(|&b| b == b'\n') {
        let lf = i + pos;
        let next = lf + 1;
        match buf.get(next) {
            Some(b'\n') => return Some(next + 1),
            Some(b'\r') if buf.get(next + 1) == Some(&b'\n') => return Some(next + 2),
            _ => i = next,
        }
    }
    None
}

/// Parses a whole request head (as [`head_end`] delimits it).
pub fn parse(head: &[u8]) -> Read {
    if head.len() > MAX_REQUEST_HEAD {
        return Read::Refused(TOO_LARGE);
    }
    match parse_head(head) {
        Ok(request) => Read::Request(request),
        Err(refusal) => Read::Refused(refusal),
    }
}

fn parse_head(head: &[u8]) -> Result<Request, Refusal> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let request_line = lines.next().unwrap_or_default();
    let request = parse_request_line(request_line)?;
    let mut content_length: Option<&[u8]> = None;
    for line in lines {
        if line.is_empty() {
            // The blank line that ends the head; nothing follows it.
            break;
        }
        let (name, value) = parse_header(line)?;
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            return Err(BODY);
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            if content_length.is_some_and(|seen| seen != value) {
                return Err(Refusal::bad("conflicting Content-Length headers"));
            }
            content_length = Some(value);
        }
    }
    if let Some(value) = content_length {
        if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
            return Err(Refusal::bad("Content-Length is not a number"));
        }
        if value.iter().any(|&b| b != b'0') {
            return Err(BODY);
        }
    }
    Ok(request)
}

const BODY: Refusal = Refusal {
    status: 413,
    reason: "request bodies are not accepted",
};

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn parse_request_line(line: &[u8]) -> Result<Request, Refusal> {
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::bad(
            "the request line is not METHOD TARGET VERSION",
        ));
    };
    if method.is_empty() || method.len() > 32 || !method.iter().all(|&b| is_tchar(b)) {
        return Err(Refusal::bad("bad method"));
    }
    match version {
        b"HTTP/1.1" | b"HTTP/1.0" => {}
        v if v.starts_with(b"HTTP/") => {
            return Err(Refusal {
                status: 505,
                reason: "HTTP/1.0 and HTTP/1.1 only",
            })
        }
        _ => return Err(Refusal::bad("bad HTTP version")),
    }
    if target.first() != Some(&b'/') || !target.iter().all(|&b| (0x21..=0x7e).contains(&b)) {
        return Err(Refusal::bad("the target must be a path starting with /"));
    }
    // Checked above: visible ASCII only, so this is UTF-8.
    let target = std::str::from_utf8(target).map_err(|_| Refusal::bad("bad target"))?;
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query.to_string())),
        None => (target, None),
    };
    let method = match method {
        b"GET" => Method::Get,
        b"HEAD" => Method::Head,
        // tchars are ASCII.
        other => Method::Other(String::from_utf8_lossy(other).into_owned()),
    };
    Ok(Request {
        method,
        path: path.to_string(),
        query,
    })
}

/// One header line: `name: value`, the name a token with no space before
/// the colon, the value without control characters other than tab.
fn parse_header(line: &[u8]) -> Result<(&[u8], &[u8]), Refusal> {
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return Err(Refusal::bad("a header line without a colon"));
    };
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        // Also refuses obsolete line folding (a line starting with space).
        return Err(Refusal::bad("bad header name"));
    }
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(Refusal::bad("a control character in a header value"));
    }
    let trim = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !trim(b)).unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !trim(b))
        .map_or(start, |e| e + 1);
    Ok((name, &value[start..end]))
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    fn request(method: Method, path: &str, query: Option<&str>) -> Read {
        Read::Request(Request {
            method,
            path: path.into(),
            query: query.map(str::to_string),
        })
    }

    fn status(read: Read) -> u16 {
        match read {
            Read::Refused(r) => r.status,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn parses_what_probes_scrapers_and_curl_send() {
        assert_eq!(
            parse(b"GET /-/ready HTTP/1.1\r\nHost: 10.0.0.1:9778\r\nUser-Agent: kube-probe/1.30\r\nAccept: */*\r\nConnection: close\r\n\r\n"),
            request(Method::Get, "/-/ready", None)
        );
        assert_eq!(
            parse(b"GET /debug/pprof/profile?seconds=5 HTTP/1.0\n\n"),
            request(Method::Get, "/debug/pprof/profile", Some("seconds=5"))
        );
        assert_eq!(
            parse(b"HEAD /status HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
            request(Method::Head, "/status", None)
        );
        assert_eq!(
            parse(b"POST /metrics HTTP/1.1\r\n\r\n"),
            request(Method::Other("POST".into()), "/metrics", None)
        );
    }

    #[test]
    fn refuses_bodies_bad_lines_and_other_versions() {
        assert_eq!(
            status(parse(b"POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\n")),
            413
        );
        assert_eq!(
            status(parse(
                b"GET /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            )),
            413
        );
        assert_eq!(
            status(parse(
                b"GET /x HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 1\r\n\r\n"
            )),
            400
        );
        assert_eq!(status(parse(b"GET /x HTTP/2.0\r\n\r\n")), 505);
        for bad in [
            &b"GET /x\r\n\r\n"[..],
            b"GET  /x HTTP/1.1\r\n\r\n",
            b"GET http://a/x HTTP/1.1\r\n\r\n",
            b"GET /x HTTP/1.1\r\n folded\r\n\r\n",
            b"GET /x HTTP/1.1\r\nNo colon\r\n\r\n",
            b"GET /x HTTP/1.1\r\nA: b\x00c\r\n\r\n",
            b"G\xffT /x HTTP/1.1\r\n\r\n",
            b"GET /\xff HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(
                status(parse(bad)),
                400,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn finds_the_end_of_the_head() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\nrest"), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n"), None);
        assert_eq!(head_end(b"\n\n"), Some(2));
        assert_eq!(head_end(b""), None);
    }

    fn header_name() -> impl Strategy<Value = String> {
        "[A-Za-z][A-Za-z0-9-]{0,15}".prop_filter("no body headers", |n| {
            !n.eq_ignore_ascii_case("content-length")
                && !n.eq_ignore_ascii_case("transfer-encoding")
        })
    }

    proptest! {
        /// Any bytes: no panic; a request only if the bytes are a head of
        /// the grammar, a refusal with one of the four statuses otherwise.
        #[test]
        fn arbitrary_bytes_parse_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            if let Some(end) = head_end(&bytes) {
                prop_assert!(end <= bytes.len());
                match parse(&bytes[..end]) {
                    Read::Request(r) => {
                        let method = match &r.method {
                            Method::Get => "GET",
                            Method::Head => "HEAD",
                            Method::Other(m) => m.as_str(),
                        };
                        let target = match &r.query {
                            Some(q) => format!("{}?{q}", r.path),
                            None => r.path.clone(),
                        };
                        let line = format!("{method} {target} HTTP/1.");
                        prop_assert!(bytes.starts_with(line.as_bytes()));
                    }
                    Read::Refused(r) => prop_assert!([400, 413, 431, 505].contains(&r.status)),
                    Read::Incomplete => prop_assert!(false, "parse never says incomplete"),
                }
            }
        }

        /// Requests of the grammar, with any headers, parse to what was sent.
        #[test]
        fn well_formed_requests_parse_to_what_was_sent(
            get in any::<bool>(),
            path in "/[A-Za-z0-9/._~-]{0,64}",
            query in proptest::option::of("[A-Za-z0-9=&%]{0,32}"),
            headers in proptest::collection::vec((header_name(), "[ -~]{0,64}"), 0..8),
            crlf in any::<bool>(),
        ) {
            let eol = if crlf { "\r\n" } else { "\n" };
            let method = if get { "GET" } else { "HEAD" };
            let target = match &query { Some(q) => format!("{path}?{q}"), None => path.clone() };
            let mut text = format!("{method} {target} HTTP/1.1{eol}");
            for (name, value) in &headers {
                text.push_str(&format!("{name}: {value}{eol}"));
            }
            text.push_str(eol);
            prop_assert_eq!(head_end(text.as_bytes()), Some(text.len()));
            let method = if get { Method::Get } else { Method::Head };
            prop_assert_eq!(parse(text.as_bytes()), Read::Request(Request { method, path, query }));
        }
    }
}
