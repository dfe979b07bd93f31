//! Reading one sample out of a Prometheus text exposition (an agent's, kube-proxy's or
//! etcd's `/metrics`), for the suites and the benchmarks.

/// The value of the series named `series` (its labels included when given), or of its
/// IPv4 series when the metric is labelled by family as kube-proxy's are.
#[must_use]
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(series)?;
            let rest = rest.strip_prefix("{ip_family=\"IPv4\"}").unwrap_or(rest);
            rest.strip_prefix(' ')
        })
        .and_then(|v| v.split(' ').next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::sample;

    #[test]
    fn finds_a_series_its_ipv4_family_and_a_labelled_bucket() {
        let text = "# HELP x\nsyncs_total 3\nlast{ip_family=\"IPv4\"} 1.5\n\
                    fsync_bucket{le=\"0.032\"} 7\n";
        assert_eq!(sample(text, "syncs_total"), Some(3.0));
        assert_eq!(sample(text, "last"), Some(1.5));
        assert_eq!(sample(text, "fsync_bucket{le=\"0.032\"}"), Some(7.0));
        assert_eq!(sample(text, "missing"), None);
    }
}
