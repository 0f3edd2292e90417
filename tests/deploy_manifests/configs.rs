//! The TOML configs under `deploy/`: every file loads with the real loader, the example
//! topologies say what their names promise, and what every member config of one cluster must
//! satisfy (used by the systemd, compose and Kubernetes checks too).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use replicator_config::{parse_str, Config};

use crate::{
    assert_no_problems, deploy, files_under, read, relative, TestResult, API_PORT, DATA_DIR,
    RAFT_PORT,
};

/// The template placeholder that `deploy/kubernetes/entrypoint.sh` replaces with the node id.
pub(crate) const NODE_ID_PLACEHOLDER: &str = "@NODE_ID@";

/// The `${NAME}` references of a config text, as the loader resolves them: the loader is run
/// with an environment that records every name it is asked for (and resolves all of them, so
/// none stops the substitution early). Text that is not TOML has none.
pub(crate) fn referenced_vars(text: &str) -> BTreeSet<String> {
    let names = RefCell::new(BTreeSet::new());
    let _result = parse_str(text, "", |name| {
        names.borrow_mut().insert(name.to_owned());
        Some(String::new())
    });
    names.into_inner()
}

pub(crate) fn load(
    text: &str,
    origin: &str,
    env: &BTreeMap<String, String>,
) -> Result<Config, String> {
    parse_str(text, origin, |name| env.get(name).cloned()).map_err(|e| e.to_string())
}

/// A fake environment that defines every variable `text` references.
pub(crate) fn fake_env(text: &str) -> BTreeMap<String, String> {
    referenced_vars(text)
        .into_iter()
        .map(|name| {
            let value = match name.as_str() {
                "POD_NAME" => "iggy-replicator-0".to_owned(),
                "POD_NAMESPACE" => "replication".to_owned(),
                _ => format!("test-value-of-{}", name.to_lowercase().replace('_', "-")),
            };
            (name, value)
        })
        .collect()
}

/// `(host, port)` of a `host:port` string.
pub(crate) fn host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

/// `(user, password, host, port)` of an `iggy://user:password@host:port?options` URL.
pub(crate) fn url_parts(url: &str) -> Option<(&str, &str, &str, u16)> {
    let (_, rest) = url.split_once("://")?;
    let (credentials, address) = rest.rsplit_once('@')?;
    let (user, password) = credentials.split_once(':')?;
    let address = address.split('?').next()?;
    let (host, port) = host_port(address)?;
    Some((user, password, host, port))
}

/// Checks what every member config of one cluster must satisfy; returns the problems.
pub(crate) fn check_member(config: &Config, origin: &str, expected_id: u64) -> Vec<String> {
    let mut problems = Vec::new();
    if config.node.id != expected_id {
        problems.push(format!(
            "{origin}: node.id is {}, expected {expected_id}",
            config.node.id
        ));
    }
    if config.node.data_dir != Path::new(DATA_DIR) {
        problems.push(format!(
            "{origin}: node.data_dir is {}, expected {DATA_DIR}",
            config.node.data_dir.display()
        ));
    }
    let members = config.initial_members();
    if members.len() != 3 {
        problems.push(format!(
            "{origin}: {} initial members, expected 3",
            members.len()
        ));
    }
    if members.get(&config.node.id) != Some(&config.node.raft_addr) {
        problems.push(format!(
            "{origin}: node.raft_addr {} is not initial_members.{}",
            config.node.raft_addr, config.node.id
        ));
    }
    for addr in members.values() {
        if host_port(addr).map(|(_, port)| port) != Some(RAFT_PORT) {
            problems.push(format!(
                "{origin}: member {addr} is not on port {RAFT_PORT}"
            ));
        }
    }
    if host_port(&config.node.api_addr).map(|(_, port)| port) != Some(API_PORT) {
        problems.push(format!(
            "{origin}: node.api_addr {} is not on port {API_PORT}",
            config.node.api_addr
        ));
    }
    problems
}

#[test]
fn every_toml_file_in_deploy_loads_with_the_real_loader() -> TestResult {
    let files = files_under(&deploy(), &[".toml"]);
    let mut problems = Vec::new();
    let mut loaded = BTreeSet::new();
    for path in &files {
        let origin = relative(path);
        let text = read(path)?;
        if text.contains(NODE_ID_PLACEHOLDER) {
            for id in 1..=3u64 {
                let rendered = text.replace(NODE_ID_PLACEHOLDER, &id.to_string());
                let mut env = fake_env(&rendered);
                if env.contains_key("POD_NAME") {
                    env.insert("POD_NAME".into(), format!("iggy-replicator-{}", id - 1));
                }
                match load(&rendered, &origin, &env) {
                    Ok(config) => problems.extend(check_member(&config, &origin, id)),
                    Err(error) => problems.push(format!("{origin} (node {id}): {error}")),
                }
            }
        } else {
            match load(&text, &origin, &fake_env(&text)) {
                Ok(config) => {
                    if config.flows.is_empty() {
                        problems.push(format!("{origin}: no [[flows]]"));
                    }
                }
                Err(error) => problems.push(format!("{origin}: {error}")),
            }
        }
        loaded.insert(origin);
    }
    for expected in [
        "deploy/systemd/replicator.toml",
        "deploy/docker-compose/node1.toml",
        "deploy/docker-compose/node2.toml",
        "deploy/docker-compose/node3.toml",
        "deploy/kubernetes/replicator.toml",
        "deploy/examples/one-way.toml",
        "deploy/examples/two-way.toml",
        "deploy/examples/fan-out.toml",
        "deploy/examples/to-0.9-cluster.toml",
    ] {
        if !loaded.contains(expected) {
            problems.push(format!("{expected} is missing"));
        }
    }
    assert_no_problems(&problems);
    Ok(())
}

#[test]
fn a_broken_config_is_rejected_by_the_same_check() -> TestResult {
    // The loader path above must be able to fail: an unknown alias in a deploy file.
    let path = deploy().join("examples/one-way.toml");
    let text = read(&path)?.replace("target = \"eu\"", "target = \"mars\"");
    let error = load(&text, "broken", &fake_env(&text)).expect_err("unknown alias");
    assert!(error.contains("flows[0].target"), "{error}");
    Ok(())
}

#[test]
fn referenced_vars_are_the_names_the_loader_substitutes() {
    let text = "# secret = \"${IN_A_COMMENT}\"\n[node]\nid = 1\ndata_dir = \"${DIR}/x\"\n\
                raft_addr = \"$${LITERAL}\"\napi_addr = \"${HOST}:${PORT}\"\n";
    let names: Vec<String> = referenced_vars(text).into_iter().collect();
    assert_eq!(names, ["DIR", "HOST", "PORT"]);
    assert!(referenced_vars("id = @NODE_ID@").is_empty());
}

fn example(name: &str) -> Result<Config, String> {
    let path = deploy().join("examples").join(name);
    let text = read(&path)?;
    load(&text, &relative(&path), &fake_env(&text))
}

#[test]
fn example_configs_describe_their_topologies() -> TestResult {
    let route = |config: &Config| -> Vec<(String, String)> {
        config
            .flows
            .iter()
            .map(|f| (f.source.clone(), f.target.clone()))
            .collect()
    };
    let one_way = example("one-way.toml")?;
    assert_eq!(route(&one_way), [("us".to_owned(), "eu".to_owned())]);

    let two_way = example("two-way.toml")?;
    assert_eq!(
        route(&two_way),
        [
            ("us".to_owned(), "eu".to_owned()),
            ("eu".to_owned(), "us".to_owned())
        ]
    );
    for flow in &two_way.flows {
        assert_eq!(
            flow.naming,
            replicator_model::Naming::Identity,
            "{}",
            flow.name
        );
        assert!(flow.provenance, "{}: two-way needs provenance", flow.name);
    }

    let fan_out = example("fan-out.toml")?;
    assert_eq!(
        route(&fan_out),
        [
            ("us".to_owned(), "eu".to_owned()),
            ("us".to_owned(), "ap".to_owned())
        ]
    );

    // An Iggy 0.9 cluster is named by every replica's address.
    let to_cluster = example("to-0.9-cluster.toml")?;
    assert_eq!(route(&to_cluster), [("old".to_owned(), "new".to_owned())]);
    let new = &to_cluster.clusters["new"];
    assert_eq!(new.iggy_version, replicator_model::IggyVersion::V0_9);
    assert_eq!(replicator_model::seed_urls(new.url.expose()).len(), 3);
    Ok(())
}
