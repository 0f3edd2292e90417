//! The seed addresses of an Iggy cluster URL: a replicated Iggy 0.9 cluster is named by
//! several, so that no one replica is a single point of failure for the replicator.

/// The parts of a cluster URL: scheme, `credentials@` (or nothing), the seed addresses in the
/// order written, and the options with their `?` (or nothing). `None` without a scheme.
fn parts(url: &str) -> Option<(&str, &str, Vec<&str>, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    // Options start at the first `?` after the credentials (a password has no `@`).
    let at = rest.rfind('@');
    let options_from = rest[at.unwrap_or(0)..]
        .find('?')
        .map_or(rest.len(), |q| at.unwrap_or(0) + q);
    let (head, options) = rest.split_at(options_from);
    let (credentials, hosts) = match head.rfind('@') {
        Some(at) => head.split_at(at + 1),
        None => ("", head),
    };
    let hosts = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    Some((scheme, credentials, hosts, options))
}

/// The connection string of each seed address of an Iggy cluster URL, in the order written:
/// `iggy://user:pass@h1:8090,h2:8090?nodelay=true` gives `iggy://user:pass@h1:8090?nodelay=true`
/// and `iggy://user:pass@h2:8090?nodelay=true` (credentials and options are the cluster's, the
/// same for every address). A URL of one address gives itself; empty addresses are skipped.
pub fn seed_urls(url: &str) -> Vec<String> {
    match parts(url) {
        Some((scheme, credentials, hosts, options)) if !hosts.is_empty() => hosts
            .into_iter()
            .map(|host| format!("{scheme}://{credentials}{host}{options}"))
            .collect(),
        _ => vec![url.to_owned()],
    }
}

/// The seed addresses (`host:port`) of an Iggy cluster URL, in the order written, without
/// credentials or options.
pub fn seed_addresses(url: &str) -> Vec<String> {
    parts(url).map_or_else(Vec::new, |(_, _, hosts, _)| {
        hosts.into_iter().map(str::to_owned).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::{seed_addresses, seed_urls};

    #[test]
    fn each_seed_keeps_the_credentials_and_options() {
        assert_eq!(
            seed_urls("iggy://u:p@h1:8090, h2:8091,?nodelay=true"),
            vec![
                "iggy://u:p@h1:8090?nodelay=true".to_owned(),
                "iggy://u:p@h2:8091?nodelay=true".to_owned()
            ]
        );
        assert_eq!(
            seed_urls("iggy+tcp://u:p@h1:8090"),
            vec!["iggy+tcp://u:p@h1:8090".to_owned()]
        );
        assert_eq!(
            seed_urls("iggy://h1:1,h2:2"),
            vec!["iggy://h1:1".to_owned(), "iggy://h2:2".to_owned()]
        );
        assert_eq!(seed_urls("nonsense"), vec!["nonsense".to_owned()]);
        assert_eq!(
            seed_addresses("iggy://u:p@h1:8090, h2:8091?nodelay=true"),
            vec!["h1:8090".to_owned(), "h2:8091".to_owned()]
        );
    }
}
