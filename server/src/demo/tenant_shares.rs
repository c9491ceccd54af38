//! `demo --tenants`: the tenants and each one's share of the requests, in
//! the load generator's `--tenants` form (`big=10,small=1`). The demo runs
//! each tenant alone at its share of the rate, so it keeps the shares
//! (the load generator's mix does not show them), and every name must be
//! one the frontend's tenants file takes, since the demo writes one
//! (`tenants_file.rs`).

use std::fmt;
use std::str::FromStr;

use crate::demo::tenants_file;
use crate::frontend::tenants::Tenants;
use crate::loadgen::TenantMix;

/// Most tenants: each one is a run of its own, alone.
pub(crate) const MAX_DEMO_TENANTS: usize = 8;

/// The tenants of `--tenants`, each with its share (summing to 1), in the
/// order given.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantShares(TenantMix);

impl TenantShares {
    /// How many tenants (at least 2).
    pub(crate) fn count(&self) -> usize {
        self.0.len()
    }

    /// Tenant `i`'s name, also its API key.
    pub(crate) fn name(&self, i: usize) -> &str {
        self.0.name(i)
    }

    /// Tenant `i`'s share of the requests.
    pub(crate) fn share(&self, i: usize) -> f64 {
        self.0.share(i)
    }

    /// Every name, in order.
    pub(crate) fn names(&self) -> Vec<String> {
        (0..self.count()).map(|i| self.name(i).to_owned()).collect()
    }

    /// The first tenant with the smallest share.
    pub(crate) fn smallest(&self) -> usize {
        (0..self.count()).fold(0, |min, i| if self.share(i) < self.share(min) { i } else { min })
    }

    /// The load generator's `--tenants` for all of them together.
    pub(crate) fn together(&self) -> String {
        self.to_string()
    }

    /// The load generator's `--tenants` for tenant `i` alone.
    pub(crate) fn alone(&self, i: usize) -> String {
        format!("{}=1", self.name(i))
    }
}

impl FromStr for TenantShares {
    type Err = String;

    /// The load generator's `--tenants` (`big=10,small=1`), with 2 to
    /// [`MAX_DEMO_TENANTS`] tenants, each with a positive share, and names
    /// the frontend's tenants file takes (neither `other` nor `default`).
    fn from_str(s: &str) -> Result<Self, String> {
        let mix: TenantMix = s.parse()?;
        if !(2..=MAX_DEMO_TENANTS).contains(&mix.len()) {
            return Err(format!("2 to {MAX_DEMO_TENANTS} tenants (each runs alone once), not {}", mix.len()));
        }
        if let Some(i) = (0..mix.len()).find(|i| mix.share(*i) <= 0.0) {
            return Err(format!("{}'s share must be a positive number (every tenant sends), not 0", mix.name(i)));
        }
        let shares = TenantShares(mix);
        // The frontend's own rules (reserved names): the file it would load.
        Tenants::parse(&tenants_file::text(&shares.names()), false, "the demo's tenants file")?;
        Ok(shares)
    }
}

impl fmt::Display for TenantShares {
    /// `name=share,...` with the normalised shares, exactly.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = (0..self.count()).map(|i| format!("{}={}", self.name(i), self.share(i))).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_normalised_and_kept_in_order() {
        let t: TenantShares = "big=10, small = 1".parse().unwrap();
        assert_eq!((t.count(), t.name(0), t.name(1)), (2, "big", "small"));
        assert!((t.share(0) - 10.0 / 11.0).abs() < 1e-12 && (t.share(1) - 1.0 / 11.0).abs() < 1e-12);
        assert_eq!(t.smallest(), 1);
        assert_eq!(t.alone(1), "small=1");
        assert_eq!(t.together().parse::<TenantShares>().unwrap(), t, "the shares survive the round trip");
        let tie: TenantShares = "a=2,b=1,c=1".parse().unwrap();
        assert_eq!(tie.smallest(), 1, "the first of the smallest");
    }

    #[test]
    fn bad_tenants_say_what_is_wrong() {
        let many: Vec<String> = (0..=MAX_DEMO_TENANTS).map(|i| format!("t{i}=1")).collect();
        for (bad, error) in [
            ("big", "`big`: expected NAME=SHARE"),
            ("Big=1,b=1", "`Big`: a tenant name"),
            ("a\"b=1,c=1", "a tenant name"),
            ("a=x,b=1", "`x` is not a number"),
            ("a=0,b=1", "a's share must be a positive number"),
            ("a=1,a=2", "`a` is given twice"),
            ("solo=1", "2 to 8 tenants (each runs alone once), not 1"),
            (&many.join(","), "not 9"),
            ("other=1,b=1", "tenant \"other\": the name \"other\" is reserved"),
            ("default=1,b=1", "the default tenant (requests with no key or an unknown one) cannot have keys"),
        ] {
            let got = bad.parse::<TenantShares>().expect_err(bad);
            assert!(got.contains(error), "{bad:?}: {got}");
        }
    }
}
