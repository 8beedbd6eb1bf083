//! Identities and the agent-send grammar: which key names (a group such as
//! `canary`, a row key `<backend>/<server>`) exist, and how HAProxy's
//! agent-send line lists them, with the limits on length and count.

/// Longest identity (one KV key below the prefix) accepted, in bytes.
pub const MAX_IDENTITY_LEN: usize = 255;

/// The key below the prefix that the Consul client reads to check the
/// token's read access (`ConsulClient::list_prefix`). `~` is not allowed
/// in identities, so no state key can have this name.
pub const READ_CHECK_KEY: &str = "~read-check";

/// The key below the prefix whose every write releases all keys the agents
/// hold after a rollback (`state release-rollback`). `~` is not allowed in
/// identities, so no state key has this name; the agent does not count it
/// as a key or an invalid key.
pub const RELEASE_ROLLBACK_KEY: &str = "~release-rollback";

/// The key below the prefix that names the store: a random id the writer
/// CLI creates (only if absent) before its first write. An answer that lacks
/// the id the agent's served state has, or shows another, comes from a store
/// that lost its data (a rebuilt cluster, a `-dev` restart, an old snapshot
/// restored), whatever its index. `~` is not allowed in identities, so no
/// state key has this name.
pub const STORE_ID_KEY: &str = "~store-id";

/// The folder below the prefix that holds the writer's records
/// ([`super::meta`]): `~meta/`. `~` is not allowed in identities, so no
/// state key lies below it.
pub const META_PREFIX: &str = "~meta/";

/// Whether a key relative to the prefix lies below [`META_PREFIX`].
pub fn is_meta_key(rel: &str) -> bool {
    rel.starts_with(META_PREFIX)
}

/// Whether a key below the prefix (relative) is one of the agent's own
/// control keys ([`READ_CHECK_KEY`], [`RELEASE_ROLLBACK_KEY`],
/// [`STORE_ID_KEY`], [`GENERATION_KEY`](super::generation::GENERATION_KEY))
/// or a writer's record below [`META_PREFIX`], not state: never served,
/// counted as a key, or invalid.
pub fn is_control_key(rel: &str) -> bool {
    rel == RELEASE_ROLLBACK_KEY
        || rel == READ_CHECK_KEY
        || rel == STORE_ID_KEY
        || rel == super::generation::GENERATION_KEY
        || is_meta_key(rel)
}

/// Why an identity (a key name or an agent-send word) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidIdentity {
    /// Empty identity.
    #[error("empty identity")]
    Empty,
    /// Longer than [`MAX_IDENTITY_LEN`] bytes.
    #[error("identity longer than {MAX_IDENTITY_LEN} bytes")]
    TooLong,
    /// A byte outside `A-Z a-z 0-9 . _ - :` and the one `/` of a row key.
    #[error("identity {0:?} has a character outside A-Z a-z 0-9 . _ - : /")]
    BadCharacter(String),
    /// A row key is `<backend>/<server>`: exactly one `/`, both parts
    /// non-empty; no part is `.` or `..`.
    #[error("identity {0:?} is neither a group nor <backend>/<server>")]
    BadShape(String),
}

/// Checks one identity: a group key (`canary`) or a row key
/// (`<backend>/<server>`), made of the characters HAProxy allows in proxy and
/// server names (doc configuration.txt "4. Proxies": letters, digits, `-`,
/// `_`, `.`, `:`).
///
/// # Errors
///
/// [`InvalidIdentity`] naming what is wrong.
pub fn validate_identity(identity: &str) -> Result<(), InvalidIdentity> {
    if identity.is_empty() {
        return Err(InvalidIdentity::Empty);
    }
    if identity.len() > MAX_IDENTITY_LEN {
        return Err(InvalidIdentity::TooLong);
    }
    // One pass over the bytes: this runs for every identity of every
    // agent-check.
    let bytes = identity.as_bytes();
    let mut slashes = 0;
    let mut slash_at = 0;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' | b':' => {}
            b'/' => {
                slashes += 1;
                slash_at = i;
            }
            _ => return Err(InvalidIdentity::BadCharacter(truncate(identity, 64))),
        }
    }
    // `.` and `..` as a name would be path segments in the Consul key
    // (`<prefix>../x` is `gitlab-haproxy-agent/x`, outside the prefix).
    let dot_segment = |part: &[u8]| part == b"." || part == b"..";
    let bad_shape = match slashes {
        0 => dot_segment(bytes),
        1 => {
            let (backend, server) = (&bytes[..slash_at], &bytes[slash_at + 1..]);
            backend.is_empty() || server.is_empty() || dot_segment(backend) || dot_segment(server)
        }
        _ => true,
    };
    if bad_shape {
        return Err(InvalidIdentity::BadShape(truncate(identity, 64)));
    }
    Ok(())
}

/// Longest agent-send line accepted, LF included: 1 KiB. Real lines are a
/// row key and a few groups.
pub const MAX_LINE: usize = 1024;

/// Most identities accepted on one line.
pub const MAX_IDENTITIES: usize = 16;

/// Why an agent-send line was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadLine {
    /// No identities.
    #[error("empty agent-send line")]
    Empty,
    /// More than [`MAX_IDENTITIES`].
    #[error("more than {MAX_IDENTITIES} identities")]
    TooMany,
    /// An identity that is not a group or row key.
    #[error(transparent)]
    Identity(#[from] InvalidIdentity),
    /// Not UTF-8.
    #[error("agent-send line is not UTF-8")]
    NotUtf8,
}

/// Parses an agent-send line without its LF (a trailing CR is dropped):
/// identities separated by spaces or tabs, in order (row key first).
///
/// # Errors
///
/// [`BadLine`] for an empty line, too many identities, or an identity that
/// is not a valid group or row key.
pub fn parse_line(line: &[u8]) -> Result<Vec<&str>, BadLine> {
    check_line(line).map(|text| identities(text).collect())
}

/// Checks an agent-send line as [`parse_line`] does, without collecting the
/// identities: returns the line's text (CR dropped), whose [`identities`]
/// are then all valid.
pub fn check_line(line: &[u8]) -> Result<&str, BadLine> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line).map_err(|_| BadLine::NotUtf8)?;
    let mut count = 0;
    for id in identities(text) {
        if count == MAX_IDENTITIES {
            return Err(BadLine::TooMany);
        }
        validate_identity(id)?;
        count += 1;
    }
    if count == 0 {
        return Err(BadLine::Empty);
    }
    Ok(text)
}

/// The identities of a line, in order.
pub fn identities(text: &str) -> impl Iterator<Item = &str> {
    text.split([' ', '\t']).filter(|s| !s.is_empty())
}

/// The first `max_chars` characters of `text`, for error messages that
/// quote what was refused.
pub fn truncate(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_follow_haproxy_name_rules() {
        assert_eq!(validate_identity("web/web-cny-01"), Ok(()));
        assert_eq!(validate_identity("canary"), Ok(()));
        assert_eq!(validate_identity("zone:us-east1-b"), Ok(()));
        assert_eq!(validate_identity(""), Err(InvalidIdentity::Empty));
        for dots in ["..", ".", "../x", "./canary", "web/..", "web/."] {
            assert!(
                matches!(validate_identity(dots), Err(InvalidIdentity::BadShape(_))),
                "{dots}"
            );
        }
        assert_eq!(validate_identity("web/web.01"), Ok(()));
        assert_eq!(validate_identity("..web/...x"), Ok(()));
        assert!(matches!(
            validate_identity("a/b/c"),
            Err(InvalidIdentity::BadShape(_))
        ));
        assert!(matches!(
            validate_identity("/web"),
            Err(InvalidIdentity::BadShape(_))
        ));
        assert!(matches!(
            validate_identity("web/"),
            Err(InvalidIdentity::BadShape(_))
        ));
        for bad in ["$HOME", "a#b", "a\"b", "a b", "caf\u{e9}"] {
            assert!(matches!(
                validate_identity(bad),
                Err(InvalidIdentity::BadCharacter(_))
            ));
        }
        assert_eq!(
            validate_identity(&"a".repeat(256)),
            Err(InvalidIdentity::TooLong)
        );
    }

    #[test]
    fn parses_identities_in_order() {
        assert_eq!(
            parse_line(b"web/web-cny-01 canary"),
            Ok(vec!["web/web-cny-01", "canary"])
        );
        assert_eq!(
            parse_line(b"web/web-01\tcanary  zone:b\r"),
            Ok(vec!["web/web-01", "canary", "zone:b"])
        );
        assert_eq!(
            check_line(b"web/web-01\tcanary\r"),
            Ok("web/web-01\tcanary")
        );
    }

    use proptest::prelude::*;

    /// What the grammar says of one word, written out independently of
    /// [`validate_identity`].
    fn is_identity(word: &str) -> bool {
        let allowed = |c: char| c.is_ascii_alphanumeric() || "._-:".contains(c);
        let part = |p: &str| !p.is_empty() && p != "." && p != ".." && p.chars().all(allowed);
        let parts: Vec<&str> = word.split('/').collect();
        word.len() <= MAX_IDENTITY_LEN
            && matches!(parts.len(), 1 | 2)
            && parts.iter().all(|p| part(p))
    }

    proptest! {
        /// Any bytes: no panic, and a line is taken exactly when it is
        /// UTF-8 with 1 to 16 words, each a group or a row key; what is
        /// taken is its words in order.
        #[test]
        fn any_bytes_are_parsed_or_refused_as_the_grammar_says(
            bytes in proptest::collection::vec(
                prop_oneof![
                    4 => proptest::sample::select(b"abz09._-:/ \t\r".to_vec()),
                    1 => any::<u8>(),
                ],
                0..MAX_LINE,
            )
        ) {
            let result = parse_line(&bytes);
            let text = std::str::from_utf8(bytes.strip_suffix(b"\r").unwrap_or(&bytes));
            let expected = match text {
                Err(_) => None,
                Ok(text) => {
                    let words: Vec<&str> = text.split([' ', '\t']).filter(|w| !w.is_empty()).collect();
                    let ok = !words.is_empty() && words.len() <= MAX_IDENTITIES && words.iter().all(|w| is_identity(w));
                    ok.then_some(words)
                }
            };
            prop_assert_eq!(result.ok(), expected);
        }

        /// Lines of valid identities parse to those identities.
        #[test]
        fn lines_of_identities_parse_to_them(
            ids in proptest::collection::vec("[a-z0-9:_-][a-z0-9.:_-]{0,20}(/[a-z0-9:_-][a-z0-9.:_-]{0,20})?", 1..=MAX_IDENTITIES),
            tab in any::<bool>(),
            cr in any::<bool>(),
        ) {
            let mut line = ids.join(if tab { "\t" } else { " " });
            if cr {
                line.push('\r');
            }
            let parsed = parse_line(line.as_bytes());
            prop_assert_eq!(parsed, Ok(ids.iter().map(String::as_str).collect::<Vec<_>>()));
        }
    }

    #[test]
    fn refuses_bad_lines() {
        assert_eq!(parse_line(b""), Err(BadLine::Empty));
        assert_eq!(parse_line(b" \t\r"), Err(BadLine::Empty));
        assert_eq!(parse_line(b"\xff\xfe"), Err(BadLine::NotUtf8));
        assert!(matches!(
            parse_line(b"web/web-01 $HOME"),
            Err(BadLine::Identity(_))
        ));
        assert!(matches!(parse_line(b"a/b/c"), Err(BadLine::Identity(_))));
        let many = vec!["g"; MAX_IDENTITIES + 1].join(" ");
        assert_eq!(parse_line(many.as_bytes()), Err(BadLine::TooMany));
        let most = vec!["g"; MAX_IDENTITIES].join(" ");
        assert_eq!(
            parse_line(most.as_bytes()).map(|v| v.len()),
            Ok(MAX_IDENTITIES)
        );
    }
}
