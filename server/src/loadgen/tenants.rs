//! `--tenants`: the share of requests each tenant sends. Each arrival draws
//! its tenant (from the run's seeded generator, after its class) and sends
//! the tenant's name as its API key (`Authorization: Bearer <name>`) and in
//! `x-loadgate-tenant`; the report then counts each tenant apart
//! (`report.rs`: `ClassReport`, one per tenant).

use std::fmt;
use std::str::FromStr;

use reqwest::header::HeaderValue;

use crate::loadgen::mix::shares_sum_error;

/// The header a frontend started with `--trust-priority-header` reads the
/// tenant from.
pub(crate) const TENANT_HEADER: &str = "x-loadgate-tenant";

/// Most tenants `--tenants` takes.
pub const MAX_TENANTS: usize = 64;

/// Longest tenant name (as the frontend's tenants file).
const MAX_NAME_LEN: usize = 64;

/// The share of arrivals each tenant sends (summing to 1), in the order the
/// tenants were given.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantMix {
    names: Vec<String>,
    shares: Vec<f64>,
}

impl TenantMix {
    /// The index of an arrival's tenant, for `u` uniform in `[0, 1)`.
    pub(crate) fn draw(&self, u: f64) -> usize {
        let mut below = 0.0;
        for (i, share) in self.shares.iter().enumerate() {
            below += share;
            if u < below {
                return i;
            }
        }
        // Rounding left `u` above the last sum: the last tenant with a share.
        self.shares.iter().rposition(|s| *s > 0.0).unwrap_or(0)
    }

    /// Tenant `i`'s name.
    ///
    /// # Panics
    ///
    /// `i` is not below [`TenantMix::len`].
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// Tenant `i`'s share of the arrivals.
    ///
    /// # Panics
    ///
    /// `i` is not below [`TenantMix::len`].
    pub fn share(&self, i: usize) -> f64 {
        self.shares[i]
    }

    /// How many tenants (at least 1).
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// The headers each tenant's requests carry, by index: built once per run.
    pub(crate) fn headers(&self) -> Vec<TenantHeaders> {
        self.names
            .iter()
            .map(|name| {
                // A name is `[a-z0-9_-]`: always a valid header value.
                let mut authorization =
                    HeaderValue::from_str(&format!("Bearer {name}")).expect("a tenant name is a header value");
                authorization.set_sensitive(true);
                let tenant = HeaderValue::from_str(name).expect("a tenant name is a header value");
                TenantHeaders { authorization, tenant }
            })
            .collect()
    }
}

/// What one tenant's requests send: its name as the bearer key and in
/// [`TENANT_HEADER`].
#[derive(Clone, Debug)]
pub(crate) struct TenantHeaders {
    /// `Bearer <name>`.
    pub(crate) authorization: HeaderValue,
    /// `<name>`.
    pub(crate) tenant: HeaderValue,
}

impl FromStr for TenantMix {
    type Err = String;

    /// `a=10,b=1`: names of 1 to 64 characters among `a-z 0-9 _ -`, each
    /// at most once, at most 64 of them; non-negative weights (any scale:
    /// they are normalised).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut names: Vec<String> = Vec::new();
        let mut shares = Vec::new();
        for item in s.split(',') {
            let (name, value) =
                item.split_once('=').ok_or_else(|| format!("`{}`: expected NAME=SHARE", item.trim()))?;
            let name = name.trim();
            if !valid_name(name) {
                let shown: String = name.chars().take(MAX_NAME_LEN).collect();
                return Err(format!(
                    "`{shown}`: a tenant name is 1 to {MAX_NAME_LEN} characters among a-z, 0-9, _ and -"
                ));
            }
            let share: f64 = value.trim().parse().map_err(|_| format!("`{}` is not a number", value.trim()))?;
            if !share.is_finite() || share < 0.0 {
                return Err(format!("{name}'s share must be a non-negative number, not {share}"));
            }
            if names.iter().any(|n| n == name) {
                return Err(format!("`{name}` is given twice"));
            }
            if names.len() == MAX_TENANTS {
                return Err(format!("at most {MAX_TENANTS} tenants"));
            }
            names.push(name.to_owned());
            shares.push(share);
        }
        let sum: f64 = shares.iter().sum();
        if !(sum > 0.0 && sum.is_finite()) {
            return Err(shares_sum_error(sum));
        }
        Ok(TenantMix { names, shares: shares.into_iter().map(|s| s / sum).collect() })
    }
}

/// `[a-z0-9_-]{1,64}`.
fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

impl fmt::Display for TenantMix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.names.iter().zip(&self.shares).map(|(n, s)| format!("{n}={s:.2}")).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_parse_normalise_and_draw_by_share() {
        let mix: TenantMix = "a=3, b-2 = 1,c_3=0".parse().unwrap();
        assert_eq!(mix.len(), 3);
        assert_eq!((mix.name(0), mix.name(1), mix.name(2)), ("a", "b-2", "c_3"), "in the order given");
        assert!((mix.shares[0] - 0.75).abs() < 1e-12);
        assert!((mix.shares[1] - 0.25).abs() < 1e-12);
        assert_eq!(mix.shares[2], 0.0);
        assert_eq!(mix.to_string(), "a=0.75,b-2=0.25,c_3=0.00");
        assert_eq!(mix.draw(0.0), 0);
        assert_eq!(mix.draw(0.749), 0);
        assert_eq!(mix.draw(0.751), 1);
        assert_eq!(mix.draw(0.999_999_999_999), 1);
        assert_eq!(mix.draw(1.0), 1, "past the last sum: the last tenant with a share, not c_3");
        let only: TenantMix = "solo=0.5".parse().unwrap();
        assert!((0..10).all(|i| only.draw(f64::from(i) / 10.0) == 0));
        let long = "x".repeat(64);
        assert_eq!(format!("{long}=1").parse::<TenantMix>().unwrap().name(0), long);
        let most: Vec<String> = (0..MAX_TENANTS).map(|i| format!("t{i}=1")).collect();
        let most: TenantMix = most.join(",").parse().unwrap();
        assert_eq!(most.len(), MAX_TENANTS);
        assert_eq!(most.draw(0.5), MAX_TENANTS / 2);
    }

    #[test]
    fn each_tenant_draws_about_its_share() {
        let mix: TenantMix = "a=10,b=1".parse().unwrap();
        let mut rng = fastrand::Rng::with_seed(7);
        let mut counts = [0u32; 2];
        for _ in 0..110_000 {
            counts[mix.draw(rng.f64())] += 1;
        }
        assert!((9_000..11_000).contains(&counts[1]), "{counts:?}");
    }

    #[test]
    fn bad_tenants_say_what_is_wrong() {
        let too_many: Vec<String> = (0..=MAX_TENANTS).map(|i| format!("t{i}=1")).collect();
        let too_long = format!("{}=1", "x".repeat(65));
        for (bad, error) in [
            ("", "``: expected NAME=SHARE"),
            ("a", "`a`: expected NAME=SHARE"),
            ("a=1,", "``: expected NAME=SHARE"),
            ("=1", "``: a tenant name is 1 to 64 characters among a-z, 0-9, _ and -"),
            ("Acme=1", "`Acme`: a tenant name"),
            ("a.b=1", "`a.b`: a tenant name"),
            ("a b=1", "`a b`: a tenant name"),
            (&too_long, "a tenant name is 1 to 64"),
            ("a=x", "`x` is not a number"),
            ("a=-1", "a's share must be a non-negative number, not -1"),
            ("a=inf", "a's share must be a non-negative number, not inf"),
            ("a=NaN", "a's share must be a non-negative number, not NaN"),
            ("a=1,a=2", "`a` is given twice"),
            ("a=0,b=0", "the shares must add up to more than 0"),
            ("a=1e308,b=1e308", "the shares must add up to a finite number"),
            (&too_many.join(","), "at most 64 tenants"),
        ] {
            let got = bad.parse::<TenantMix>().expect_err(bad);
            assert!(got.contains(error), "{bad:?}: {got}");
        }
    }

    #[test]
    fn each_tenant_sends_its_name_as_its_key_and_in_the_header() {
        let mix: TenantMix = "a=1,team-b=1".parse().unwrap();
        let headers = mix.headers();
        assert_eq!(headers[1].authorization, "Bearer team-b");
        assert!(headers[1].authorization.is_sensitive());
        assert_eq!(headers[1].tenant, "team-b");
    }
}
