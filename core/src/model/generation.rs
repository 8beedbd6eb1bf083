//! The store's write generation ([`GENERATION_KEY`]): a counter and a short
//! history of random ids that the writer CLI advances by compare-and-set in
//! every transaction it makes. It tells a store that lost writes apart from
//! one that moved on, whatever the index says:
//!
//! - a restored snapshot brings back an older generation; anything the
//!   writer writes after it starts a new branch, whose history does not
//!   hold the id the agent served (Consul has no restore epoch: the index
//!   moves forward again after a restore, and the store id is the
//!   snapshot's);
//! - a reaped tombstone changes no key, and a writer's delete writes the
//!   generation in the same transaction, so the prefix index stays at that
//!   write and the generation only moves forward.
//!
//! Text form (the value of the key): the generation number and the ids of
//! the last generations, newest first, separated by spaces:
//! `42 9f0c1d2e3a4b5c6d 0123456789abcdef ...` (at most [`HISTORY`] ids, each
//! 16 lowercase hex digits). Writes by hand (`consul kv put`) leave it
//! alone: they are not part of the history, and a restore that undoes only
//! them cannot be told from a delete.

use std::fmt;

/// The key below the prefix that holds the write generation. `~` is not
/// allowed in identities, so no state key has this name.
pub const GENERATION_KEY: &str = "~generation";

/// How many ids of past generations the value keeps (the newest first,
/// its own included): an agent that missed fewer writer transactions than
/// this tells exactly whether the store descends from what it served.
/// 64 ids are about 1.1 KB.
pub const HISTORY: usize = 64;

/// One write generation as the key shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    /// The generation number: 1 for the first write, one more per writer
    /// transaction.
    pub number: u64,
    /// Ids of generations `number`, `number - 1`, ..., newest first; never
    /// empty, at most [`HISTORY`].
    pub ids: Vec<u64>,
}

/// The generation an agent served: its number and id, which is all a later
/// answer is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenerationMark {
    /// The generation number.
    pub number: u64,
    /// Its id.
    pub id: u64,
}

/// How a store's generation stands to the one an agent served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lineage {
    /// The same generation.
    Same,
    /// A later generation whose history holds the one served: the store
    /// moved on by writer transactions.
    Descends,
    /// A generation the history cannot link to the one served (more than
    /// [`HISTORY`] transactions apart): nothing is known either way.
    TooFar,
    /// Another branch: the generation served is not in the history (a
    /// restored snapshot, then writes), or an older generation.
    Lost,
}

/// Why a generation value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("generation value {0:?} is not `<number> <16-hex id>...`")]
pub struct BadGeneration(pub String);

impl Generation {
    /// The first generation, with id `id`.
    pub fn first(id: u64) -> Generation {
        Generation {
            number: 1,
            ids: vec![id],
        }
    }

    /// The generation after this one, with id `id`: the number plus one,
    /// the history shifted by one and cut to [`HISTORY`].
    pub fn next(&self, id: u64) -> Generation {
        let mut ids = Vec::with_capacity(HISTORY);
        ids.push(id);
        ids.extend(self.ids.iter().copied().take(HISTORY - 1));
        Generation {
            number: self.number.saturating_add(1),
            ids,
        }
    }

    /// Its number and id.
    pub fn mark(&self) -> GenerationMark {
        GenerationMark {
            number: self.number,
            id: self.ids[0],
        }
    }

    /// Parses the key's value.
    ///
    /// # Errors
    ///
    /// [`BadGeneration`] unless the value is a number of at least 1 and
    /// 1 to [`HISTORY`] ids of 16 hex digits, no more than the number.
    pub fn parse(raw: &[u8]) -> Result<Generation, BadGeneration> {
        let bad = || BadGeneration(String::from_utf8_lossy(raw).into_owned());
        let text = std::str::from_utf8(raw).map_err(|_| bad())?;
        let mut words = text.split_ascii_whitespace();
        let number: u64 = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
        let mut ids = Vec::new();
        for w in words {
            if w.len() != 16 || ids.len() == HISTORY {
                return Err(bad());
            }
            ids.push(u64::from_str_radix(w, 16).map_err(|_| bad())?);
        }
        if number == 0 || ids.is_empty() || ids.len() as u64 > number {
            return Err(bad());
        }
        Ok(Generation { number, ids })
    }

    /// How this generation stands to `served`.
    pub fn lineage(&self, served: GenerationMark) -> Lineage {
        if self.number < served.number {
            return Lineage::Lost;
        }
        let back = self.number - served.number;
        match self.ids.get(back as usize) {
            Some(id) if *id == served.id && back == 0 => Lineage::Same,
            Some(id) if *id == served.id => Lineage::Descends,
            Some(_) => Lineage::Lost,
            None => Lineage::TooFar,
        }
    }
}

impl fmt::Display for Generation {
    /// The key's value: `<number> <id> <id> ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.number)?;
        for id in &self.ids {
            write!(f, " {id:016x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_form_round_trips_and_keeps_at_most_the_history() {
        let mut g = Generation::first(0xabc);
        assert_eq!(g.to_string(), "1 0000000000000abc");
        for i in 0..100u64 {
            g = g.next(i);
        }
        assert_eq!(g.number, 101);
        assert_eq!(g.ids.len(), HISTORY);
        assert_eq!(g.ids[0], 99);
        assert_eq!(Generation::parse(g.to_string().as_bytes()), Ok(g));
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in [
            "",
            "0 0000000000000001",
            "1",
            "x 0000000000000001",
            "1 01",
            "1 000000000000000g",
            "1 0000000000000001 0000000000000002",
        ] {
            assert!(Generation::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let long = format!("100{}", " 0000000000000001".repeat(HISTORY + 1));
        assert!(Generation::parse(long.as_bytes()).is_err());
    }

    #[test]
    fn lineage_tells_a_later_write_from_a_restore_then_a_write() {
        let a = Generation::first(1);
        let b = a.next(2);
        let c = b.next(3);
        assert_eq!(b.lineage(b.mark()), Lineage::Same);
        assert_eq!(c.lineage(a.mark()), Lineage::Descends);
        assert_eq!(a.lineage(b.mark()), Lineage::Lost);
        // Restored to `a`, then written: the same number as `b`, another id.
        let branch = a.next(7);
        assert_eq!(branch.lineage(b.mark()), Lineage::Lost);
        assert_eq!(branch.next(8).lineage(b.mark()), Lineage::Lost);
        let mut far = c.clone();
        for i in 0..HISTORY as u64 {
            far = far.next(100 + i);
        }
        assert_eq!(far.lineage(a.mark()), Lineage::TooFar);
    }
}
