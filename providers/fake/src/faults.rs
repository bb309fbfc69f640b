//! Fault injection: errors and latency, decided by a seeded generator so runs repeat.

use std::time::Duration;

use cloud_provider::CloudError;

use crate::Method;

/// What an injected fault returns.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// A plain error with this message.
    Error(String),
    /// [`CloudError::InstanceNotFound`].
    InstanceNotFound,
    /// [`CloudError::NotImplemented`].
    NotImplemented,
    /// [`CloudError::RetryAfter`].
    RetryAfter {
        /// The delay asked for.
        after: Duration,
        /// The message.
        message: String,
    },
}

impl Fault {
    /// The error this fault produces for a call to `method`.
    pub fn to_error(&self, method: Method) -> CloudError {
        match self {
            Fault::Error(message) => {
                CloudError::message(format!("injected fault in {method}: {message}"))
            }
            Fault::InstanceNotFound => CloudError::InstanceNotFound,
            Fault::NotImplemented => CloudError::NotImplemented,
            Fault::RetryAfter { after, message } => {
                CloudError::retry_after(*after, message.clone())
            }
        }
    }
}

/// When a fault fires: for which methods, how often, and how many times at most.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    /// The methods it applies to; empty means every method.
    pub methods: Vec<Method>,
    /// What it returns.
    pub fault: Fault,
    /// The chance of firing on each matching call, from 0.0 to 1.0.
    pub probability: f64,
    /// How many more times it may fire; `None` is unlimited.
    pub remaining: Option<u64>,
}

impl FaultRule {
    /// A rule that fires on every call to any method.
    pub fn always(fault: Fault) -> Self {
        FaultRule {
            methods: Vec::new(),
            fault,
            probability: 1.0,
            remaining: None,
        }
    }

    /// Restricts the rule to one method (call again to add more).
    pub fn on(mut self, method: Method) -> Self {
        self.methods.push(method);
        self
    }

    /// Fires with this probability (clamped to 0.0..=1.0).
    pub fn with_probability(mut self, probability: f64) -> Self {
        self.probability = probability.clamp(0.0, 1.0);
        self
    }

    /// Fires at most `times` times.
    pub fn times(mut self, times: u64) -> Self {
        self.remaining = Some(times);
        self
    }

    fn applies_to(&self, method: Method) -> bool {
        self.remaining != Some(0) && (self.methods.is_empty() || self.methods.contains(&method))
    }
}

/// SplitMix64: tiny, fast and fully determined by its seed, so a seeded fake repeats exactly.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in [0, 1).
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The active rules and the generator that decides them.
#[derive(Debug)]
pub(crate) struct FaultPlan {
    rules: Vec<FaultRule>,
    rng: Rng,
}

impl FaultPlan {
    pub(crate) fn new(seed: u64) -> Self {
        FaultPlan {
            rules: Vec::new(),
            rng: Rng::new(seed),
        }
    }

    pub(crate) fn add(&mut self, rule: FaultRule) {
        self.rules.push(rule);
    }

    pub(crate) fn clear(&mut self) {
        self.rules.clear();
    }

    /// The fault for this call, if any rule fires. Rules are tried in the order added; the
    /// first that fires wins. Only rules that apply draw from the generator, so adding a rule
    /// for one method does not change the draws of another.
    pub(crate) fn decide(&mut self, method: Method) -> Option<Fault> {
        for rule in &mut self.rules {
            if !rule.applies_to(method) {
                continue;
            }
            let fires = rule.probability >= 1.0 || self.rng.next_f64() < rule.probability;
            if fires {
                if let Some(remaining) = &mut rule.remaining {
                    *remaining -= 1;
                }
                return Some(rule.fault.clone());
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_decisions_repeat() {
        let run = |seed| {
            let mut plan = FaultPlan::new(seed);
            plan.add(FaultRule::always(Fault::Error("x".into())).with_probability(0.3));
            (0..1000)
                .map(|_| plan.decide(Method::ListRoutes).is_some())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let fired = run(7).iter().filter(|f| **f).count();
        assert!(
            (240..360).contains(&fired),
            "30% of 1000 fired {fired} times"
        );
    }

    #[test]
    fn times_and_methods_limit_rules() {
        let mut plan = FaultPlan::new(1);
        plan.add(
            FaultRule::always(Fault::InstanceNotFound)
                .on(Method::InstanceMetadata)
                .times(2),
        );
        assert_eq!(plan.decide(Method::InstanceExists), None);
        assert_eq!(
            plan.decide(Method::InstanceMetadata),
            Some(Fault::InstanceNotFound)
        );
        assert_eq!(
            plan.decide(Method::InstanceMetadata),
            Some(Fault::InstanceNotFound)
        );
        assert_eq!(plan.decide(Method::InstanceMetadata), None);
    }

    #[test]
    fn rng_is_uniform_enough() {
        let mut rng = Rng::new(42);
        let mean = (0..10_000).map(|_| rng.next_f64()).sum::<f64>() / 10_000.0;
        assert!((0.48..0.52).contains(&mean), "mean {mean}");
    }
}
