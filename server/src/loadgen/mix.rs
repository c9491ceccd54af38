//! `--mix`: the share of requests in each priority class. Each arrival
//! draws its class (from the run's seeded generator) and sends it in
//! `x-loadgate-priority`; the report then counts each class apart
//! (`report.rs`: `ClassReport`).

use std::fmt;
use std::str::FromStr;

use loadgate::{Class, PerClass};

/// The header a frontend started with `--trust-priority-header` reads.
pub(crate) const PRIORITY_HEADER: &str = "x-loadgate-priority";

/// The share of arrivals in each class (summing to 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassMix(PerClass<f64>);

impl ClassMix {
    /// The class of an arrival, for `u` uniform in `[0, 1)`.
    pub(crate) fn draw(&self, u: f64) -> Class {
        let mut below = 0.0;
        for class in Class::ALL {
            below += self.0.get(class);
            if u < below {
                return class;
            }
        }
        // Rounding left `u` above the last sum: the last class with a share.
        Class::ALL.into_iter().rev().find(|c| self.0.get(*c) > 0.0).unwrap_or(Class::Standard)
    }

    /// `class`'s share.
    pub fn share(&self, class: Class) -> f64 {
        self.0.get(class)
    }
}

impl FromStr for ClassMix {
    type Err = String;

    /// `critical=0.3,standard=0.4,sheddable=0.3`: non-negative weights (any
    /// scale: they are normalised), each class at most once; a class not
    /// named gets none.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut shares = PerClass::all(None);
        for item in s.split(',') {
            let (name, value) =
                item.split_once('=').ok_or_else(|| format!("`{}`: expected CLASS=SHARE", item.trim()))?;
            let class: Class = name.trim().parse().map_err(|e: loadgate::class::UnknownClass| e.to_string())?;
            let share: f64 = value.trim().parse().map_err(|_| format!("`{}` is not a number", value.trim()))?;
            if !share.is_finite() || share < 0.0 {
                return Err(format!("{class}'s share must be a non-negative number, not {share}"));
            }
            let slot = &mut shares.0[class.index()];
            if slot.replace(share).is_some() {
                return Err(format!("`{class}` is given twice"));
            }
        }
        let shares = shares.map(|s| s.unwrap_or(0.0));
        let sum: f64 = shares.0.iter().sum();
        if !(sum > 0.0 && sum.is_finite()) {
            return Err(shares_sum_error(sum));
        }
        Ok(ClassMix(shares.map(|s| s / sum)))
    }
}

impl fmt::Display for ClassMix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = Class::ALL.iter().map(|c| format!("{c}={:.2}", self.share(*c))).collect();
        f.write_str(&parts.join(","))
    }
}

/// The error of shares (classes' or tenants') whose `sum` is 0 or too
/// large to be a number (each share may be finite and their sum not).
pub(crate) fn shares_sum_error(sum: f64) -> String {
    match sum.is_finite() {
        true => "the shares must add up to more than 0".to_owned(),
        false => {
            "the shares must add up to a finite number (each is at most about 1e308, and so is their sum)".to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mix_parses_normalises_and_draws_by_share() {
        let mix: ClassMix = "critical=3,standard=4,sheddable=3".parse().unwrap();
        assert!((mix.share(Class::Critical) - 0.3).abs() < 1e-12);
        assert_eq!(mix.draw(0.0), Class::Critical);
        assert_eq!(mix.draw(0.29), Class::Critical);
        assert_eq!(mix.draw(0.31), Class::Standard);
        assert_eq!(mix.draw(0.71), Class::Sheddable);
        assert_eq!(mix.draw(0.999_999_999_999), Class::Sheddable);
        let only: ClassMix = "sheddable=1".parse().unwrap();
        assert!((0..10).all(|i| only.draw(f64::from(i) / 10.0) == Class::Sheddable));
        assert_eq!(only.draw(1.0), Class::Sheddable, "past the last sum: the last class with a share");
        for bad in [
            "",
            "critical",
            "critical=-1",
            "critical=x",
            "urgent=1",
            "critical=0",
            "critical=1,critical=1",
            "critical=inf",
        ] {
            assert!(bad.parse::<ClassMix>().is_err(), "{bad:?}");
        }
        let error = "critical=1e308,standard=1e308".parse::<ClassMix>().expect_err("an infinite sum");
        assert!(error.contains("finite"), "{error}");
    }
}
