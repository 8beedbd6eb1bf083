//! Declaring metric families: each owner (the watcher, the responder, the
//! rows seen, the HTTP port) declares its own in the agent's one registry,
//! under the `gitlab_haproxy_agent_` namespace.

use prometheus::core::Collector;
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry,
};

const NAMESPACE: &str = "gitlab_haproxy_agent";

/// The registry families are declared in.
///
/// # Panics
///
/// Each method panics only on a programming error: a name declared twice
/// or not a valid metric name.
pub struct Families<'a>(pub(super) &'a Registry);

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help).namespace(NAMESPACE)
}

impl Families<'_> {
    fn register<C: Collector + Clone + 'static>(&self, family: C) -> C {
        self.0
            .register(Box::new(family.clone()))
            .expect("metric names are unique");
        family
    }

    /// A gauge of whole numbers.
    pub fn int_gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::with_opts(opts(name, help)).expect("a valid metric"))
    }

    /// A gauge.
    pub fn gauge(&self, name: &str, help: &str) -> Gauge {
        self.register(Gauge::with_opts(opts(name, help)).expect("a valid metric"))
    }

    /// A counter.
    pub fn int_counter(&self, name: &str, help: &str) -> IntCounter {
        self.register(IntCounter::with_opts(opts(name, help)).expect("a valid metric"))
    }

    /// A counter with labels; `values` of the first label exist at 0 from
    /// start-up.
    pub fn int_counter_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        values: &[&str],
    ) -> IntCounterVec {
        let family = IntCounterVec::new(opts(name, help), labels).expect("a valid metric");
        for value in values {
            family.with_label_values(&[value]);
        }
        self.register(family)
    }

    /// A gauge of whole numbers with labels.
    pub fn int_gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.register(IntGaugeVec::new(opts(name, help), labels).expect("a valid metric"))
    }

    /// A gauge with labels.
    pub fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        self.register(GaugeVec::new(opts(name, help), labels).expect("a valid metric"))
    }

    /// A histogram with `buckets`, in seconds.
    pub fn histogram(&self, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
        let opts = HistogramOpts::new(name, help)
            .namespace(NAMESPACE)
            .buckets(buckets);
        self.register(Histogram::with_opts(opts).expect("a valid metric"))
    }
}
