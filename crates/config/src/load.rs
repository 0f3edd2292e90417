//! Reading a config: TOML text → `${VAR}` substitution in string values →
//! typed [`Config`] → validation. Substitution happens on parsed values, so an
//! environment value can never change the TOML structure.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Problem, Result};
use crate::schema::Config;

/// Reads, substitutes, parses and validates the config file at `path`, taking
/// `${VAR}` values from the process environment.
pub fn load_file(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_str(&text, &path.display().to_string(), |name| {
        std::env::var(name).ok()
    })
}

/// Parses and validates config text. `origin` names the text in errors (a path);
/// `env` resolves `${VAR}` references (the process environment in production, a
/// map in tests).
pub fn parse_str(text: &str, origin: &str, env: impl Fn(&str) -> Option<String>) -> Result<Config> {
    let syntax = |message: String| Error::Syntax {
        origin: origin.to_owned(),
        message,
    };
    let mut value: toml::Value = toml::from_str(text).map_err(|e| syntax(e.to_string()))?;
    let mut problems = Vec::new();
    substitute(&mut value, String::new(), &env, &mut problems);
    if !problems.is_empty() {
        return Err(Error::Invalid {
            origin: origin.to_owned(),
            problems,
        });
    }
    let config = Config::deserialize(value).map_err(|e| syntax(e.to_string()))?;
    let problems = config.problems();
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(Error::Invalid {
            origin: origin.to_owned(),
            problems,
        })
    }
}

/// Replaces `${NAME}` in every string value; `$${` writes a literal `${`.
fn substitute(
    value: &mut toml::Value,
    key: String,
    env: &impl Fn(&str) -> Option<String>,
    problems: &mut Vec<Problem>,
) {
    match value {
        toml::Value::String(text) => match expand(text, env) {
            Ok(expanded) => *text = expanded,
            Err(message) => problems.push(Problem::new(key, message)),
        },
        toml::Value::Array(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                substitute(item, format!("{key}[{index}]"), env, problems);
            }
        }
        toml::Value::Table(table) => {
            for (name, item) in table.iter_mut() {
                let path = if key.is_empty() {
                    name.clone()
                } else {
                    format!("{key}.{name}")
                };
                substitute(item, path, env, problems);
            }
        }
        _ => {}
    }
}

fn expand(text: &str, env: &impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('$') {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        if let Some(after) = tail.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = tail.strip_prefix("${") {
            let end = after
                .find('}')
                .ok_or_else(|| "unterminated ${ in value".to_owned())?;
            let name = &after[..end];
            let valid =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!("invalid environment variable name {name:?}"));
            }
            let resolved =
                env(name).ok_or_else(|| format!("environment variable {name} is not set"))?;
            out.push_str(&resolved);
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use replicator_model::{IggyVersion, InitialOffset, Naming};

    use super::*;

    /// A valid file with substitutions (`SECRET`, `PASS`) and a non-default value in every
    /// section.
    fn valid() -> String {
        crate::testing::MinimalConfig {
            secret: "${SECRET}".to_owned(),
            initial_members: (1..=3)
                .map(|id| (id, format!("127.0.0.1:710{id}")))
                .collect(),
            us_url: "iggy://iggy:${PASS}@127.0.0.1:8090".to_owned(),
            eu_url: "iggy+tcp://iggy:iggy@127.0.0.1:8091?nodelay=true".to_owned(),
            eu_extra: "connections = 2".to_owned(),
            include: vec!["orders/*".to_owned()],
            flow_extra: "naming = \"prefix\"\ninitial_offset = 42\npoll_interval = \"10ms\""
                .to_owned(),
            ..Default::default()
        }
        .to_string()
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    /// Parses `text` with `SECRET` set to `secret` and `PASS` to `pw`.
    fn parse_with_secret(text: &str, secret: &str) -> Result<crate::Config> {
        parse_str(text, "t", env(&[("SECRET", secret), ("PASS", "pw")]))
    }

    fn problem_keys(error: Error) -> Vec<String> {
        match error {
            Error::Invalid { problems, .. } => problems.into_iter().map(|p| p.key).collect(),
            other => panic!("expected Invalid, got {other}"),
        }
    }

    #[test]
    fn a_url_may_name_several_seed_addresses_each_with_a_port() {
        let seeds = valid().replace(
            "127.0.0.1:8090",
            "10.0.0.1:8090, 10.0.0.2:8090,10.0.0.3:8090",
        );
        parse_with_secret(&seeds, "0123456789abcdef").expect("several seeds");
        let portless = valid().replace("127.0.0.1:8090", "10.0.0.1:8090,10.0.0.2");
        let keys =
            problem_keys(parse_with_secret(&portless, "0123456789abcdef").expect_err("no port"));
        assert_eq!(keys, vec!["clusters.us.url".to_owned()]);
    }

    #[test]
    fn valid_file_parses_with_defaults_and_substitution() {
        let config = parse_with_secret(&valid(), "0123456789abcdef").expect("valid");
        assert_eq!(config.cluster.secret.expose(), "0123456789abcdef");
        assert_eq!(
            config.clusters["us"].url.expose(),
            "iggy://iggy:pw@127.0.0.1:8090"
        );
        assert_eq!(
            config.clusters["us"].connections,
            crate::DEFAULT_CONNECTIONS
        );
        assert_eq!(config.clusters["eu"].connections, 2);
        let flow = &config.flows[0];
        assert_eq!(flow.naming, Naming::Prefix);
        assert_eq!(flow.initial_offset.resolve(), Some(InitialOffset::At(42)));
        assert_eq!(flow.batch_size, 1000);
        assert_eq!(flow.poll_interval, Duration::from_millis(10));
        assert!(flow.provenance);
        assert!(flow.consumer_groups.is_empty());
        assert_eq!(flow.max_messages_per_second, None, "unlimited by default");
        assert_eq!(
            flow.consumer_group_sync_interval,
            replicator_model::DEFAULT_GROUP_SYNC_INTERVAL
        );
        assert_eq!(flow.heartbeat_interval, Duration::from_secs(1));
        assert_eq!(flow.heartbeat_topic, "replicator/heartbeats");
        assert!(flow.users.is_empty() && flow.keep_target_settings.is_empty());
        assert!(!flow.delete_users_removed_upstream);
        assert_eq!(
            flow.metadata_sync_interval,
            replicator_model::DEFAULT_METADATA_SYNC_INTERVAL
        );
        assert_eq!(config.pipeline.discovery_interval, Duration::from_secs(5));
        assert_eq!(config.initial_members().len(), 3);
    }

    #[test]
    fn heartbeat_keys_take_humantime_zero_and_another_topic() {
        let text = valid().replace(
            "poll_interval = \"10ms\"",
            "poll_interval = \"10ms\"\nheartbeat_interval = \"0s\"\nheartbeat_topic = \"ops/hb\"",
        );
        let config = parse_with_secret(&text, "0123456789abcdef").expect("valid");
        assert_eq!(config.flows[0].heartbeat_interval, Duration::ZERO);
        assert_eq!(config.flows[0].heartbeat_topic, "ops/hb");
        let text = valid().replace(
            "poll_interval = \"10ms\"",
            "poll_interval = \"10ms\"\nheartbeat_interval = \"250ms\"",
        );
        let config = parse_with_secret(&text, "0123456789abcdef").expect("valid");
        assert_eq!(
            config.flows[0].heartbeat_interval,
            Duration::from_millis(250)
        );
    }

    #[test]
    fn heartbeat_topic_that_is_not_a_literal_stream_slash_topic_is_a_problem() {
        for bad in ["heartbeats", "/hb", "ops/", "ops/*", "ops/hb/x", "o?s/hb"] {
            let text = valid().replace(
                "poll_interval = \"10ms\"",
                &format!("poll_interval = \"10ms\"\nheartbeat_topic = {bad:?}"),
            );
            let keys =
                problem_keys(parse_with_secret(&text, "0123456789abcdef").expect_err("invalid"));
            assert_eq!(keys, ["flows[0].heartbeat_topic"], "{bad:?}");
        }
        let text = valid().replace(
            "poll_interval = \"10ms\"",
            "poll_interval = \"10ms\"\nheartbeat_interval = \"soon\"",
        );
        let error = parse_with_secret(&text, "0123456789abcdef").expect_err("invalid");
        assert!(error.to_string().contains("heartbeat_interval"), "{error}");
    }

    #[test]
    fn the_iggy_version_defaults_to_08_and_a_wrong_one_is_named() {
        let config = parse_with_secret(&valid(), "0123456789abcdef").expect("valid");
        assert_eq!(config.clusters["us"].iggy_version, IggyVersion::V0_8);
        let text = valid().replace("connections = 2", "connections = 2\niggy_version = \"0.9\"");
        let config = parse_with_secret(&text, "0123456789abcdef").expect("valid");
        assert_eq!(config.clusters["eu"].iggy_version, IggyVersion::V0_9);
        let text = valid().replace(
            "connections = 2",
            "connections = 2\niggy_version = \"0.10\"",
        );
        let error = parse_with_secret(&text, "0123456789abcdef").expect_err("invalid");
        let message = error.to_string();
        assert!(message.contains("iggy_version"), "{message}");
        assert!(message.contains("\"0.8\" or \"0.9\""), "{message}");
    }

    #[test]
    fn unknown_key_is_rejected_naming_it() {
        let text = valid().replace("naming = \"prefix\"", "namingg = \"prefix\"");
        let error = parse_with_secret(&text, "0123456789abcdef").expect_err("unknown key");
        assert!(matches!(error, Error::Syntax { .. }));
        assert!(error.to_string().contains("namingg"), "{error}");
    }

    #[test]
    fn missing_env_var_names_key_and_variable() {
        let error = parse_str(&valid(), "t", env(&[("PASS", "p")])).expect_err("missing var");
        assert!(error.to_string().contains("cluster.secret"), "{error}");
        assert!(error.to_string().contains("SECRET"), "{error}");
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let text = valid()
            .replace("source = \"us\"", "source = \"asia\"")
            .replace("[\"orders/*\"]", "[\"orders/[\"]")
            .replace("iggy://iggy:${PASS}@127.0.0.1:8090", "http://nope")
            .replace("initial_offset = 42", "initial_offset = \"oldest\"")
            .replace("connections = 2", "connections = 0\nfar_connections = 65")
            .replace(
                "poll_interval = \"10ms\"",
                "poll_interval = \"10ms\"\nmax_batch_bytes = 1000\nidle_poll_interval = \"11s\"\nconsumer_groups = [\"ok-*\", \"bad[\"]\nconsumer_group_sync_interval = \"10ms\"\nmax_bytes_per_second = 0\nusers = [\"app-*\", \"x[\"]\nmetadata_sync_interval = \"10ms\"",
            );
        let keys =
            problem_keys(parse_str(&text, "t", env(&[("SECRET", "short")])).expect_err("invalid"));
        for expected in [
            "cluster.secret",
            "clusters.us.url",
            "flows[0].source",
            "flows[0].include[0]",
            "flows[0].initial_offset",
            "clusters.eu.connections",
            "clusters.eu.far_connections",
            "flows[0].max_batch_bytes",
            "flows[0].idle_poll_interval",
            "flows[0].consumer_groups[1]",
            "flows[0].consumer_group_sync_interval",
            "flows[0].max_bytes_per_second",
            "flows[0].users[1]",
            "flows[0].metadata_sync_interval",
        ] {
            assert!(keys.iter().any(|k| k == expected), "{expected} in {keys:?}");
        }
    }

    #[test]
    fn admin_token_equal_to_the_secret_and_unreadable_tls_files_are_problems() {
        let text = valid().replace(
            "[cluster]\n",
            "[cluster]\nadmin_token = \"${SECRET}\"\ntls = { cert_file = \"/nonexistent/n.crt\", key_file = \"/nonexistent/n.key\", ca_file = \"/nonexistent/ca.crt\" }\n",
        );
        assert!(
            text.contains("admin_token"),
            "valid() has a [cluster] section"
        );
        let keys = problem_keys(parse_with_secret(&text, "0123456789abcdef").expect_err("invalid"));
        for expected in [
            "cluster.admin_token",
            "cluster.tls.cert_file",
            "cluster.tls.key_file",
            "cluster.tls.ca_file",
        ] {
            assert!(keys.iter().any(|k| k == expected), "{expected} in {keys:?}");
        }
    }

    /// The minimal config with a second flow `second` (lines of its own) after `us-to-eu`
    /// over `first` and `extra` lines of the first flow; `clusters` are extra lines of the
    /// `[clusters.eu]` section (e.g. another cluster section).
    fn two_flows(first: &[&str], extra: &str, second: &str, clusters: &str) -> String {
        crate::testing::MinimalConfig {
            include: first.iter().map(|p| (*p).to_owned()).collect(),
            eu_extra: clusters.to_owned(),
            flow_extra: format!("{extra}\n\n[[flows]]\nname = \"second\"\n{second}"),
            ..Default::default()
        }
        .to_string()
    }

    /// The problems of `text`, as (key, message).
    fn problems_of(text: &str) -> Vec<(String, String)> {
        match parse_str(text, "t", env(&[])) {
            Ok(_) => Vec::new(),
            Err(Error::Invalid { problems, .. }) => {
                problems.into_iter().map(|p| (p.key, p.message)).collect()
            }
            Err(other) => panic!("expected Invalid, got {other}"),
        }
    }

    #[test]
    fn flows_between_the_same_clusters_with_overlapping_selections_are_rejected() {
        let text = two_flows(
            &["orders/*"],
            "",
            "source = \"us\"\ntarget = \"eu\"\ninclude = [\"*/*\"]",
            "",
        );
        let problems = problems_of(&text);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let (key, message) = &problems[0];
        assert_eq!(key, "flows[1].include");
        for part in ["\"second\"", "\"us-to-eu\"", "flows[0]", "\"orders/a\""] {
            assert!(message.contains(part), "{part} in {message}");
        }
        // The usual split of a cluster over two flows is fine.
        let split = two_flows(
            &["orders/*"],
            "",
            "source = \"us\"\ntarget = \"eu\"\ninclude = [\"*/*\"]\nexclude = [\"orders/*\"]",
            "",
        );
        assert_eq!(problems_of(&split), Vec::new());
        // So is the same selection to another target, or from another source.
        let elsewhere = "[clusters.ap]\nurl = \"iggy://iggy:iggy@127.0.0.1:8092\"";
        let fan_out = two_flows(
            &["orders/*"],
            "",
            "source = \"us\"\ntarget = \"ap\"\ninclude = [\"orders/*\"]",
            elsewhere,
        );
        assert_eq!(problems_of(&fan_out), Vec::new());
        let two_way = two_flows(
            &["*/*"],
            "",
            "source = \"eu\"\ntarget = \"us\"\ninclude = [\"*/*\"]",
            "",
        );
        assert_eq!(problems_of(&two_way), Vec::new());
    }

    #[test]
    fn overlapping_flows_are_found_through_naming_and_aliases_of_one_cluster() {
        // Prefix naming writes `us.<stream>`: identity naming of `us.orders` writes there too.
        let text = two_flows(
            &["orders/*"],
            "naming = \"prefix\"",
            "source = \"us\"\ntarget = \"eu\"\ninclude = [\"us.orders/*\"]",
            "",
        );
        let problems = problems_of(&text);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].1.contains("\"us.orders/a\""), "{problems:?}");
        // The same selection under prefix and identity naming writes different topics.
        let apart = two_flows(
            &["orders/*"],
            "naming = \"prefix\"",
            "source = \"us\"\ntarget = \"eu\"\ninclude = [\"orders/*\"]",
            "",
        );
        assert_eq!(problems_of(&apart), Vec::new());
        // Another alias of the upstream cluster (same address) is the same cluster.
        let alias = "[clusters.us2]\nurl = \"iggy://other:secret@127.0.0.1:8090?nodelay=true\"";
        let text = two_flows(
            &["orders/*"],
            "",
            "source = \"us2\"\ntarget = \"eu\"\ninclude = [\"orders/created\"]",
            alias,
        );
        let problems = problems_of(&text);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].1.contains("\"orders/created\""), "{problems:?}");
    }

    /// The minimal config (flow `us-to-eu` over `include`, `flow` lines of its own) with
    /// `eu_zones` as the target's zones and `policies` lines after the flow.
    fn residency(include: &[&str], flow: &str, eu_zones: &str, policies: &str) -> String {
        crate::testing::MinimalConfig {
            include: include.iter().map(|p| (*p).to_owned()).collect(),
            us_extra: "zones = [\"us\"]".to_owned(),
            eu_extra: eu_zones.to_owned(),
            flow_extra: format!("{flow}\n\n{policies}"),
            ..Default::default()
        }
        .to_string()
    }

    /// Asserts that `text` has exactly one problem, of `key`, whose message has every one of
    /// `parts`.
    fn assert_one_problem(text: &str, key: &str, parts: &[&str]) {
        let problems = problems_of(text);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let (found, message) = &problems[0];
        assert_eq!(found, key);
        for part in parts {
            assert!(message.contains(part), "{part} in {message}");
        }
    }

    /// A policy named `name` keeping `select` in the `us` zone.
    fn in_us(name: &str, select: &str) -> String {
        format!("[[policies]]\nname = {name:?}\nselect = [{select:?}]\nallowed_zones = [\"us\"]\n")
    }

    #[test]
    fn zones_and_policies_parse() {
        let text = residency(
            &["*/*"],
            "",
            "zones = [\"eu\", \"eu-west-1\"]",
            &in_us("pii", "pii-*/*"),
        );
        let config = parse_str(&text, "t", env(&[])).expect("valid");
        assert_eq!(config.clusters["eu"].zones, ["eu", "eu-west-1"]);
        assert_eq!(config.clusters["us"].zones, ["us"]);
        assert_eq!(config.policies.len(), 1);
        assert_eq!(config.policies[0].name, "pii");
        assert_eq!(config.policies[0].select, ["pii-*/*"]);
        assert_eq!(config.policies[0].allowed_zones, ["us"]);
        // No zones and no policies by default.
        let config = crate::testing::MinimalConfig::default()
            .parse()
            .expect("valid");
        assert!(config.clusters["eu"].zones.is_empty());
        assert!(config.policies.is_empty());
    }

    #[test]
    fn a_flow_whose_every_topic_a_policy_keeps_from_its_target_is_rejected() {
        let policy = in_us("pii-stays-in-us", "pii-*/*");
        let text = residency(&["pii-users/*"], "", "zones = [\"eu\"]", &policy);
        assert_one_problem(
            &text,
            "flows[0].include",
            &[
                "\"us-to-eu\"",
                "\"eu\" (zones [\"eu\"])",
                "policy \"pii-stays-in-us\" (policies[0], allowed zones [\"us\"])",
            ],
        );
        // Excludes count: what is left after them is all forbidden.
        let text = residency(
            &["pii-users/*", "orders/*"],
            "exclude = [\"orders/*\"]",
            "zones = [\"eu\"]",
            &policy,
        );
        assert_eq!(problems_of(&text).len(), 1);
        // A target in no zone is outside every policy's zones.
        let problems = problems_of(&residency(&["pii-users/*"], "", "", &policy));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].1.contains("\"eu\" (in no zone)"),
            "{problems:?}"
        );
    }

    #[test]
    fn policies_that_together_cover_a_flow_are_all_named_and_bystanders_are_not() {
        let policies = [
            in_us("a", "pii-a/*"),
            in_us("bystander", "audit/*"),
            in_us("b", "pii-b/*"),
        ]
        .concat();
        let problems = problems_of(&residency(
            &["pii-a/*", "pii-b/x"],
            "",
            "zones = [\"eu\"]",
            &policies,
        ));
        assert_eq!(problems.len(), 1, "{problems:?}");
        let message = &problems[0].1;
        assert!(
            message.contains(
                "policies \"a\" (policies[0], allowed zones [\"us\"]) and \"b\" (policies[2]"
            ),
            "{message}"
        );
        assert!(!message.contains("bystander"), "{message}");
    }

    #[test]
    fn a_flow_with_any_topic_allowed_on_its_target_is_accepted() {
        let policy = in_us("pii", "pii-*/*");
        // Everything but the `pii-*` streams may go to eu (`pii/x`, `orders/a`, …).
        for include in [&["*/*"][..], &["pii*/*"], &["pii-users/*", "orders/*"]] {
            let text = residency(include, "", "zones = [\"eu\"]", &policy);
            assert_eq!(problems_of(&text), Vec::new(), "{include:?}");
        }
        // A policy whose zones include the target's forbids nothing there.
        let text = residency(&["pii-users/*"], "", "zones = [\"us\", \"eu\"]", &policy);
        assert_eq!(problems_of(&text), Vec::new());
        let eu = "[[policies]]\nname = \"eu\"\nselect = [\"*/*\"]\nallowed_zones = [\"eu\"]\n";
        let text = residency(&["pii-users/*"], "", "zones = [\"eu\"]", eu);
        assert_eq!(problems_of(&text), Vec::new());
        // A flow that selects nothing on its own is not the policies' doing.
        let text = residency(
            &["pii-a/*"],
            "exclude = [\"pii-*/*\"]",
            "zones = [\"eu\"]",
            &policy,
        );
        assert_eq!(problems_of(&text), Vec::new());
    }

    #[test]
    fn heartbeats_to_a_topic_a_policy_keeps_from_the_target_are_rejected_unless_off() {
        let policy = in_us("ops", "replicator/*");
        let text = residency(&["*/*"], "", "zones = [\"eu\"]", &policy);
        assert_one_problem(
            &text,
            "flows[0].heartbeat_topic",
            &[
                "\"replicator/heartbeats\"",
                "policy \"ops\"",
                "heartbeat_interval",
            ],
        );
        let off = "heartbeat_interval = \"0s\"";
        assert_eq!(
            problems_of(&residency(&["*/*"], off, "zones = [\"eu\"]", &policy)),
            Vec::new()
        );
        let moved = "heartbeat_topic = \"ops/heartbeats\"";
        assert_eq!(
            problems_of(&residency(&["*/*"], moved, "zones = [\"eu\"]", &policy)),
            Vec::new()
        );
    }

    #[test]
    fn invalid_policies_and_zones_are_reported_with_their_keys() {
        let policies = "[[policies]]\nname = \" \"\nselect = []\nallowed_zones = []\n\n\
                        [[policies]]\nname = \"p\"\nselect = [\"ok/*\", \"bad/[\", \"nostream\"]\nallowed_zones = [\"eu\", \"\"]\n\n\
                        [[policies]]\nname = \"p\"\nselect = [\"x/*\"]\nallowed_zones = [\"eu\"]\n";
        let text = residency(&["*/*"], "", "zones = [\"eu\", \" \"]", policies);
        let keys: Vec<String> = problems_of(&text).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "clusters.eu.zones[1]",
                "policies[0].name",
                "policies[0].select",
                "policies[0].allowed_zones",
                "policies[1].select[1]",
                "policies[1].select[2]",
                "policies[1].allowed_zones[1]",
                "policies[2].name",
            ]
        );
        let missing = "[[policies]]\nname = \"p\"\nselect = [\"x/*\"]\n";
        let error = parse_str(&residency(&["*/*"], "", "", missing), "t", env(&[]))
            .expect_err("allowed_zones is required");
        assert!(error.to_string().contains("allowed_zones"), "{error}");
    }

    #[test]
    fn escaped_dollar_is_kept_literally() {
        assert_eq!(expand("a$${b}c$d", &env(&[])).as_deref(), Ok("a${b}c$d"));
        assert!(expand("${UNCLOSED", &env(&[])).is_err());
    }

    #[test]
    fn env_value_cannot_inject_toml() {
        let config = parse_with_secret(&valid(), "0123456789abcdef\"\n[evil]").expect("valid");
        assert!(config.cluster.secret.expose().ends_with("[evil]"));
    }
}
