//! The pure model, at the bottom of the crate: no I/O, no runtime, no HTTP,
//! no metrics. [`identity`] says which key names and agent-send lines exist,
//! [`value`] what a key may hold and the reply it maps to, [`snapshot`] how
//! one Consul answer becomes the copy the agent answers from, and [`marks`]
//! what a key's Flags say about who wrote it, [`meta`] who wrote a key, why
//! and until when, [`generation`] how far the writer's transactions went;
//! [`haproxy_config`] which servers an HAProxy
//! configuration (or `show servers state` answer) declares, and [`answer`]
//! what one Consul read answers (its keys and freshness headers).

pub mod answer;
pub mod generation;
pub mod haproxy_config;
pub mod identity;
pub mod marks;
pub mod meta;
pub mod snapshot;
pub mod value;
