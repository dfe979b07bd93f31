//! The committed CRD YAML in the chart must be exactly what the types generate.

use std::path::Path;

#[test]
fn committed_crds_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/proxyplan/crds");
    let files = proxyplan_crds::crd_files().expect("CRDs serialise");
    assert_eq!(files.len(), 2);
    for (name, generated) in files {
        let committed = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        assert!(
            committed == generated,
            "charts/proxyplan/crds/{name} differs from the Rust types; regenerate it with \
             `cargo run -p proxyplan-crds --bin proxyplan-crdgen -- charts/proxyplan/crds`"
        );
    }
}

#[test]
fn crds_have_status_short_names_and_columns() {
    let files = proxyplan_crds::crd_files().expect("CRDs serialise");
    let plan: serde_yaml::Value = serde_yaml::from_str(&files[0].1).expect("yaml");
    let version = &plan["spec"]["versions"][0];
    assert_eq!(plan["spec"]["names"]["shortNames"][0], "npp");
    assert_eq!(plan["spec"]["scope"], "Cluster");
    assert!(version["subresources"]["status"].is_mapping());
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_sequence()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        columns,
        [
            "Node",
            "Wanted",
            "Applied",
            "Ready",
            "Services",
            "Endpoints",
            "Age"
        ]
    );
}

#[test]
fn service_plans_are_namespaced_and_no_integer_has_a_format() {
    let files = proxyplan_crds::crd_files().expect("CRDs serialise");
    let service: serde_yaml::Value = serde_yaml::from_str(&files[1].1).expect("yaml");
    assert_eq!(service["spec"]["names"]["kind"], "ServiceProxyPlan");
    assert_eq!(service["spec"]["names"]["shortNames"][0], "spp");
    assert_eq!(service["spec"]["scope"], "Namespaced");
    // The API server knows no uint16/uint32/double format and some versions warn about
    // each on every apply: integers carry minimum and maximum instead.
    for (name, text) in &files {
        for format in [
            "uint16", "uint32", "uint64", "int64", "int32", "double", "float",
        ] {
            assert!(
                !text.contains(&format!("format: {format}")),
                "{name} has format {format}"
            );
        }
    }
    let port = &service["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["servicePorts"]["items"]["properties"]["port"];
    assert_eq!(port["type"], "integer");
    assert_eq!(port["minimum"].as_f64(), Some(1.0));
    assert_eq!(port["maximum"].as_f64(), Some(65535.0));
}
