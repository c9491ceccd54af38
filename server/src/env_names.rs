//! Every flag's environment variable, by the project's rule: Dynamo's
//! `DYN_*` name where Dynamo has the flag, else `LOADGATE_<COMMAND>_<FLAG>`.
//!
//! Flag groups shared by several commands (the HTTP server's, the engine
//! scrape's, the NATS plane's) declare one variable; [`apply`] gives each
//! command its own name, and the old shared name still works for a while
//! ([`carry_deprecated`] copies it to the new one, with a deprecation line
//! on stderr).

/// Names that are Dynamo's own although they do not start with `DYN_`.
const DYNAMO_NAMES: &[&str] = &["NATS_SERVER"];

/// A variable renamed by the rule: `old` (declared) is read as `new`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rename {
    /// The name a flag group declared (still read, deprecated).
    pub old: String,
    /// The command's own name.
    pub new: String,
}

/// The rule's name for `--long` of `command`.
pub fn rule_name(command: &str, long: &str) -> String {
    format!("LOADGATE_{}_{}", command, long).to_uppercase().replace('-', "_")
}

/// Whether `name` is Dynamo's (kept as it is).
fn is_dynamos(name: &str) -> bool {
    name.starts_with("DYN_") || DYNAMO_NAMES.contains(&name)
}

/// Every flag of every subcommand of `cli` with its variable's rule name
/// and the name it declares (`None` for none).
fn flags(cli: &clap::Command) -> Vec<(String, clap::Id, String, Option<String>)> {
    let mut flags = Vec::new();
    for sub in cli.get_subcommands() {
        let command = sub.get_name().replace('-', "_");
        for arg in sub.get_arguments() {
            if let Some(long) = arg.get_long() {
                let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
                flags.push((sub.get_name().to_owned(), arg.get_id().clone(), rule_name(&command, long), env));
            }
        }
    }
    flags
}

/// Names of flags renamed since (old, new), still read.
const RETIRED: &[(&str, &str)] = &[
    ("LOADGATE_FRONTEND_HEARTBEAT_MS", "LOADGATE_FRONTEND_SHARE_HEARTBEAT_MS"),
    ("LOADGATE_FRONTEND_LEASE", "LOADGATE_FRONTEND_SHARE_LEASE"),
];

/// The declared names the rule replaces (Dynamo's are kept), and the
/// names of flags renamed since.
pub fn renames(cli: &clap::Command) -> Vec<Rename> {
    let declared = flags(cli).into_iter().filter_map(|(_, _, new, env)| {
        env.filter(|old| !is_dynamos(old) && *old != new).map(|old| Rename { old, new })
    });
    let retired = RETIRED.iter().map(|(old, new)| Rename { old: (*old).to_owned(), new: (*new).to_owned() });
    declared.chain(retired).collect()
}

/// Gives every flag of every subcommand of `cli` its rule name (a flag
/// without a variable gets one). Clap reads a variable when it is named,
/// so call [`carry_deprecated`] first.
pub fn apply(mut cli: clap::Command) -> clap::Command {
    for (sub, id, new, env) in flags(&cli) {
        if env.is_some_and(|env| is_dynamos(&env) || env == new) {
            continue;
        }
        cli = cli.mut_subcommand(sub, |sub| {
            sub.mut_arg(id, |a| a.env(clap::builder::OsStr::from(clap::builder::Str::from(new))))
        });
    }
    cli
}

/// For each deprecated name that is set while its new name is not: reads
/// it as the new one, and says so on stderr (once per old name).
pub fn carry_deprecated(renames: &[Rename]) {
    let mut said: Vec<&str> = Vec::new();
    for Rename { old, new } in renames {
        let Some(value) = std::env::var_os(old) else { continue };
        if std::env::var_os(new).is_none() {
            // Called first thing in `main`, before any thread starts.
            std::env::set_var(new, value);
        }
        if !said.contains(&old.as_str()) {
            let all: Vec<&str> = renames.iter().filter(|r| r.old == *old).map(|r| r.new.as_str()).collect();
            eprintln!("warning: the environment variable {old} is deprecated; use {} instead", all.join(" or "));
            said.push(old);
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    /// Every flag of every command reads a variable by the rule, and the
    /// shared groups' old names are the deprecated ones.
    #[test]
    fn every_flag_reads_a_variable_by_the_rule() {
        let renames = renames(&crate::Cli::command());
        let cli = apply(crate::Cli::command());
        let mut checked = 0;
        for sub in cli.get_subcommands() {
            let command = sub.get_name().replace('-', "_");
            for arg in sub.get_arguments().filter(|a| a.get_long().is_some()) {
                let long = arg.get_long().unwrap();
                let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
                let env = env.unwrap_or_else(|| panic!("{} --{long} has no variable", sub.get_name()));
                assert!(is_dynamos(&env) || env == rule_name(&command, long), "{} --{long}: {env}", sub.get_name());
                checked += 1;
            }
        }
        assert!(checked > 100, "{checked}");
        let old: Vec<&str> = renames.iter().map(|r| r.old.as_str()).collect();
        for shared in
            ["LOADGATE_HTTP_MAX_CONNECTIONS", "LOADGATE_HTTP_HEADER_TIMEOUT_SECS", "LOADGATE_ENGINE_SCRAPE_TIMEOUT_MS"]
        {
            assert!(old.contains(&shared), "{shared} not deprecated: {old:?}");
        }
        for (retired, _) in RETIRED {
            assert!(old.contains(retired), "{retired}");
        }
        let new: Vec<&str> = renames.iter().map(|r| r.new.as_str()).collect();
        assert!(
            new.contains(&"LOADGATE_FRONTEND_HTTP_MAX_CONNECTIONS")
                && new.contains(&"LOADGATE_WORKER_HTTP_MAX_CONNECTIONS")
        );
    }

    /// Every flag's variable is in docs/deployment.md, the page that
    /// promises every one (a review found fifteen that were not).
    #[test]
    fn every_flag_s_variable_is_documented() {
        const DEPLOYMENT: &str = include_str!("../../docs/deployment.md");
        let missing = crate::flags_where(&apply(crate::Cli::command()), |arg| {
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
            !DEPLOYMENT.contains(&format!("`{env}`"))
        });
        assert!(missing.is_empty(), "not in docs/deployment.md: {missing:?}");
    }
}
