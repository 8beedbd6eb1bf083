//! The KV value grammar: what a key below the prefix may hold (`ready`,
//! `drain`, `maint`, `N%`), the one reply line each value maps to, and the
//! answer kinds counted per agent-check.

use std::fmt;

use super::identity::{truncate, InvalidIdentity};

/// Largest weight percentage accepted in a KV value.
///
/// HAProxy caps a server's user weight at 256 (`SRV_UWGHT_MAX`, doc
/// configuration.txt "weight"); a larger share could never take effect.
pub const MAX_WEIGHT_PERCENT: u16 = 256;

/// One desired admin state, parsed from a KV value.
///
/// Each variant maps to exactly one reply, which names both the admin state
/// and the weight, so that whatever HAProxy applied before, the server ends in
/// the desired state: HAProxy keeps a weight set by an earlier reply until a
/// later one names another (doc configuration.txt "agent-check").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdminState {
    /// In service at the configured weight: `ready 100%`.
    Ready,
    /// No new sessions except persistent ones; `drain 100%`.
    Drain,
    /// Out of service; `maint 100%`.
    Maint,
    /// In service at this share, in percent, of the configured weight
    /// (0..=256): `ready N%`.
    Weight(u16),
}

/// How much traffic a state lets a server take: one total order, lowest
/// first, `maint < drain < 0% < lower weight < higher weight`, with `ready`
/// the configured weight, 100% (so `ready` ranks with `100%`, below `150%`).
///
/// Every rule that holds or withholds a value keeps the lower side of this
/// order, weights included: the one promise is that a server never takes
/// more traffic than the newest write allows.
///
/// Why drain ranks below `0%`: both stop new load-balanced sessions, but a
/// server at weight 0 stays READY, and HAProxy still sends it sessions that
/// persist to it and any a `use-server` or `force-persist` rule names; a
/// drained one gets only persistent sessions (doc configuration.txt
/// "agent-check", "weight").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Traffic {
    /// `maint`: out of service.
    Maint,
    /// `drain`: persistent sessions only.
    Drain,
    /// In service at this share of the configured weight, in percent
    /// (`ready` is 100).
    Weight(u16),
}

impl Traffic {
    /// What a server with no key for any of its identities takes: `ready`,
    /// the configured weight.
    pub const READY: Traffic = Traffic::Weight(100);
}

impl AdminState {
    /// Whether the state keeps its servers out of rotation: drain or maint.
    pub fn keeps_out(self) -> bool {
        matches!(self, AdminState::Drain | AdminState::Maint)
    }

    /// Where the state ranks in the order of traffic ([`Traffic`]).
    pub fn traffic(self) -> Traffic {
        match self {
            AdminState::Maint => Traffic::Maint,
            AdminState::Drain => Traffic::Drain,
            AdminState::Ready => Traffic::READY,
            AdminState::Weight(pct) => Traffic::Weight(pct),
        }
    }

    /// Whether the state gives a server more traffic than `other`.
    pub fn more_than(self, other: AdminState) -> bool {
        self.traffic() > other.traffic()
    }

    /// The state of the two that gives a server less traffic (`self` on a
    /// tie).
    pub fn least(self, other: AdminState) -> AdminState {
        if other.traffic() < self.traffic() {
            other
        } else {
            self
        }
    }

    /// The reply line sent to HAProxy, with its LF terminator.
    ///
    /// Built only from validated tokens: no KV text ever reaches HAProxy.
    pub fn reply(self) -> ReplyLine {
        let mut line = ReplyLine::default();
        match self {
            AdminState::Ready => line.push(b"ready 100%\n"),
            AdminState::Drain => line.push(b"drain 100%\n"),
            AdminState::Maint => line.push(b"maint 100%\n"),
            AdminState::Weight(pct) => {
                line.push(b"ready ");
                line.push(pct.to_string().as_bytes());
                line.push(b"%\n");
            }
        }
        line
    }

    /// The reply line as text, without its LF: `drain 100%`.
    pub fn reply_text(self) -> String {
        String::from_utf8_lossy(self.reply().as_bytes())
            .trim_end()
            .to_string()
    }

    /// The answer kind used as the `kind` label of
    /// `gitlab_haproxy_agent_answers_total`.
    pub fn kind(self) -> AnswerKind {
        match self {
            AdminState::Ready => AnswerKind::Ready,
            AdminState::Drain => AnswerKind::Drain,
            AdminState::Maint => AnswerKind::Maint,
            AdminState::Weight(_) => AnswerKind::Weight,
        }
    }
}

impl fmt::Display for AdminState {
    /// The canonical KV spelling: `ready`, `drain`, `maint` or `N%`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdminState::Ready => f.write_str("ready"),
            AdminState::Drain => f.write_str("drain"),
            AdminState::Maint => f.write_str("maint"),
            AdminState::Weight(pct) => write!(f, "{pct}%"),
        }
    }
}

impl std::str::FromStr for AdminState {
    type Err = InvalidValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_value(s.as_bytes())
    }
}

/// A reply line, at most 16 bytes, kept on the stack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplyLine {
    buf: [u8; 16],
    len: usize,
}

impl ReplyLine {
    fn push(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    /// The bytes to write, LF included.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Why a KV value was refused. The text is shown in logs and on `/status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidValue {
    /// The key exists with no value (Consul answers `"Value": null`).
    #[error("empty value")]
    Empty,
    /// The value is not UTF-8 text.
    #[error("value is not UTF-8 text")]
    NotUtf8,
    /// `up`, `down`, `stopped` or `fail`: server health belongs to HAProxy's
    /// own checks, and only `up` would undo a `down` (REFERENCE, HAProxy).
    #[error("health word {0:?} is not an admin state; use ready, drain, maint or N%")]
    HealthWord(String),
    /// A weight outside 0..=256 percent.
    #[error("weight {0}% is out of range 0%..=256%")]
    WeightOutOfRange(String),
    /// Anything else.
    #[error("{0:?} is not one of ready, drain, maint or N% (0..=256)")]
    Unknown(String),
    /// The key itself is not a valid identity, so no agent-send line can
    /// ever name it.
    #[error("key is not a valid identity: {0}")]
    Key(InvalidIdentity),
}

impl InvalidValue {
    /// What a key holding this answers (the writer's REPLY column): an
    /// agent that knew a valid value answers that (held); one that did not
    /// skips the key, and the next identity on the line decides (a server
    /// with no later key gets no answer and keeps its state); no server can
    /// name a key that is not a valid identity.
    pub fn reply_text(&self) -> String {
        match self {
            InvalidValue::Key(_) => "none (no agent-send can name this key)".to_string(),
            _ => "last valid value (held), or skipped".to_string(),
        }
    }
}

/// Parses one KV value: `ready`, `drain`, `maint` or `N%` with integer N in
/// 0..=256; ASCII case-insensitive, surrounding whitespace ignored.
///
/// # Errors
///
/// [`InvalidValue`] for anything else, including HAProxy words that are valid
/// in an agent reply but not as desired state (`up`, `down`, `maxconn:N`),
/// several words (`drain maxconn:0`), and `+50%`, `50`, `50.5%`.
pub fn parse_value(raw: &[u8]) -> Result<AdminState, InvalidValue> {
    let text = std::str::from_utf8(raw).map_err(|_| InvalidValue::NotUtf8)?;
    let text = text.trim();
    if text.is_empty() {
        return Err(InvalidValue::Empty);
    }
    if text.len() > 32 {
        // No valid value is this long; don't lowercase a 512 KiB value.
        return Err(InvalidValue::Unknown(truncate(text, 64)));
    }
    let lower = text.to_ascii_lowercase();
    match lower.as_str() {
        "ready" => return Ok(AdminState::Ready),
        "drain" => return Ok(AdminState::Drain),
        "maint" => return Ok(AdminState::Maint),
        "up" | "down" | "stopped" | "fail" => return Err(InvalidValue::HealthWord(lower)),
        _ => {}
    }
    let shown = || InvalidValue::Unknown(truncate(text, 64));
    let digits = lower.strip_suffix('%').ok_or_else(shown)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(shown());
    }
    let out_of_range = || InvalidValue::WeightOutOfRange(truncate(digits, 24));
    let pct: u16 = digits.parse().map_err(|_| out_of_range())?;
    if pct > MAX_WEIGHT_PERCENT {
        return Err(out_of_range());
    }
    Ok(AdminState::Weight(pct))
}

/// Answer kinds, the values of the `kind` label on
/// `gitlab_haproxy_agent_answers_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerKind {
    /// Replied `ready 100%`.
    Ready,
    /// Replied `drain 100%`.
    Drain,
    /// Replied `maint 100%`.
    Maint,
    /// Replied `ready N%`.
    Weight,
    /// No reply: the deciding key holds an invalid value.
    Invalid,
    /// No reply: no Consul snapshot applied yet.
    Unsynced,
    /// No reply: the agent-send line was malformed, too long or too slow.
    BadRequest,
}

impl AnswerKind {
    /// Every kind, in label order.
    pub const ALL: [AnswerKind; 7] = [
        AnswerKind::Ready,
        AnswerKind::Drain,
        AnswerKind::Maint,
        AnswerKind::Weight,
        AnswerKind::Invalid,
        AnswerKind::Unsynced,
        AnswerKind::BadRequest,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            AnswerKind::Ready => "ready",
            AnswerKind::Drain => "drain",
            AnswerKind::Maint => "maint",
            AnswerKind::Weight => "weight",
            AnswerKind::Invalid => "invalid",
            AnswerKind::Unsynced => "unsynced",
            AnswerKind::BadRequest => "bad_request",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_admin_words_case_insensitively_with_whitespace() {
        assert_eq!(parse_value(b"ready"), Ok(AdminState::Ready));
        assert_eq!(parse_value(b" DRAIN\n"), Ok(AdminState::Drain));
        assert_eq!(parse_value(b"\tMaInT "), Ok(AdminState::Maint));
    }

    #[test]
    fn parses_weights_in_range() {
        assert_eq!(parse_value(b"0%"), Ok(AdminState::Weight(0)));
        assert_eq!(parse_value(b"50%"), Ok(AdminState::Weight(50)));
        assert_eq!(parse_value(b"256%"), Ok(AdminState::Weight(256)));
        assert_eq!(parse_value(b"007%"), Ok(AdminState::Weight(7)));
        assert_eq!(
            parse_value(b"257%"),
            Err(InvalidValue::WeightOutOfRange("257".into()))
        );
        assert!(matches!(
            parse_value(b"99999999999999999999%"),
            Err(InvalidValue::WeightOutOfRange(_))
        ));
    }

    #[test]
    fn refuses_what_haproxy_would_misread_or_is_not_admin_state() {
        for bad in [
            "50",
            "+50%",
            "50.5%",
            "-1%",
            "%",
            "drian",
            "drain maxconn:0",
            "ready\ndown",
            "ready,down",
            "maxconn:10",
            "drain #why",
        ] {
            assert!(
                matches!(parse_value(bad.as_bytes()), Err(InvalidValue::Unknown(_))),
                "{bad:?} must be refused"
            );
        }
        for health in ["up", "DOWN", "stopped", "fail"] {
            assert!(matches!(
                parse_value(health.as_bytes()),
                Err(InvalidValue::HealthWord(_))
            ));
        }
        assert_eq!(parse_value(b""), Err(InvalidValue::Empty));
        assert_eq!(parse_value(b"  \n"), Err(InvalidValue::Empty));
        assert_eq!(parse_value(b"\xffready"), Err(InvalidValue::NotUtf8));
    }

    #[test]
    fn replies_name_admin_state_and_weight() {
        assert_eq!(AdminState::Ready.reply().as_bytes(), b"ready 100%\n");
        assert_eq!(AdminState::Drain.reply().as_bytes(), b"drain 100%\n");
        assert_eq!(AdminState::Maint.reply().as_bytes(), b"maint 100%\n");
        assert_eq!(AdminState::Weight(0).reply().as_bytes(), b"ready 0%\n");
        assert_eq!(AdminState::Weight(256).reply().as_bytes(), b"ready 256%\n");
    }

    use proptest::prelude::*;

    /// The grammar written out independently of [`parse_value`]: one of
    /// the three words or `N%` (0 to 256), any ASCII case, surrounding
    /// whitespace ignored.
    fn expected(bytes: &[u8]) -> Option<AdminState> {
        let text = std::str::from_utf8(bytes).ok()?.trim().to_ascii_lowercase();
        match text.as_str() {
            "ready" => Some(AdminState::Ready),
            "drain" => Some(AdminState::Drain),
            "maint" => Some(AdminState::Maint),
            _ => {
                let digits = text.strip_suffix('%')?;
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let n = digits.trim_start_matches('0');
                if n.len() > 3 {
                    return None;
                }
                let n: u16 = if n.is_empty() { 0 } else { n.parse().ok()? };
                (n <= MAX_WEIGHT_PERCENT).then_some(AdminState::Weight(n))
            }
        }
    }

    proptest! {
        /// Any bytes: no panic, taken exactly as the grammar says, and a
        /// refusal always says why.
        #[test]
        fn any_bytes_are_parsed_or_refused_as_the_grammar_says(
            bytes in proptest::collection::vec(
                prop_oneof![
                    4 => proptest::sample::select(b"readyDRAINmt%0123456789 \t\n+-.".to_vec()),
                    1 => any::<u8>(),
                ],
                0..40,
            )
        ) {
            let parsed = parse_value(&bytes);
            prop_assert_eq!(parsed.clone().ok(), expected(&bytes));
            if let Err(e) = parsed {
                prop_assert!(!e.to_string().is_empty());
            }
        }

        /// Every weight in range parses, with any zero padding, case and
        /// surrounding whitespace; its reply names it.
        #[test]
        fn weights_in_range_parse_and_reply(n in 0u16..=MAX_WEIGHT_PERCENT, zeros in 0usize..4, pad in "[ \t\n]{0,3}") {
            let text = format!("{pad}{}{n}%{pad}", "0".repeat(zeros));
            prop_assert_eq!(parse_value(text.as_bytes()), Ok(AdminState::Weight(n)));
            let reply = format!("ready {n}%\n");
            let line = AdminState::Weight(n).reply();
            prop_assert_eq!(line.as_bytes(), reply.as_bytes());
        }
    }

    #[test]
    fn traffic_is_one_order_weights_included() {
        use AdminState::*;
        let order = [
            Maint,
            Drain,
            Weight(0),
            Weight(1),
            Weight(50),
            Weight(99),
            Ready,
            Weight(101),
            Weight(256),
        ];
        for pair in order.windows(2) {
            assert!(pair[1].more_than(pair[0]), "{} > {}", pair[1], pair[0]);
            assert!(!pair[0].more_than(pair[1]));
            assert_eq!(pair[0].least(pair[1]), pair[0]);
            assert_eq!(pair[1].least(pair[0]), pair[0]);
        }
        assert_eq!(Ready.traffic(), Weight(100).traffic());
        assert!(!Ready.more_than(Weight(100)) && !Weight(100).more_than(Ready));
        assert_eq!(Ready.least(Weight(100)), Ready);
        assert_eq!(Ready.traffic(), Traffic::READY);
    }

    #[test]
    fn display_round_trips_through_parse() {
        for s in [
            AdminState::Ready,
            AdminState::Drain,
            AdminState::Maint,
            AdminState::Weight(42),
        ] {
            assert_eq!(s.to_string().parse::<AdminState>(), Ok(s));
        }
    }
}
