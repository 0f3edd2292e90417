//! The seed addresses of an Iggy cluster URL: a replicated Iggy 0.9 cluster is named by
//! several, so that no one replica is a single point of failure for the replicator.

/// The connection string of each seed address of an Iggy cluster URL, in the order written:
/// `iggy://user:pass@h1:8090,h2:8090?nodelay=true` gives `iggy://user:pass@h1:8090?nodelay=true`
/// and `iggy://user:pass@h2:8090?nodelay=true` (credentials and options are the cluster's, the
/// same for every address). A URL of one address gives itself; empty addresses are skipped.
pub fn seed_urls(url: &str) -> Vec<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return vec![url.to_owned()];
    };
    // Options start at the first `?` after the credentials (a password has no `@`).
    let at = rest.rfind('@');
    let options_from = rest[at.unwrap_or(0)..]
        .find('?')
        .map_or(rest.len(), |q| at.unwrap_or(0) + q);
    let (head, options) = rest.split_at(options_from);
    let (credentials, hosts) = match head.rsplit_once('@') {
        Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
        None => (String::new(), head),
    };
    let seeds: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|host| format!("{scheme}://{credentials}{host}{options}"))
        .collect();
    if seeds.is_empty() {
        vec![url.to_owned()]
    } else {
        seeds
    }
}

#[cfg(test)]
mod tests {
    use super::seed_urls;

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
    }
}
