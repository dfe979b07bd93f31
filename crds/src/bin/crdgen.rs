//! Writes the CRD manifests generated from the Rust types.
//!
//! `cargo run -p proxyplan-crds --bin proxyplan-crdgen -- charts/proxyplan/crds`
//! (with no argument, prints both documents to stdout).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let files = match proxyplan_crds::crd_files() {
        Ok(files) => files,
        Err(err) => {
            eprintln!("proxyplan-crdgen: {err}");
            return ExitCode::FAILURE;
        }
    };
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        for (_, text) in &files {
            print!("---\n{text}");
        }
        return ExitCode::SUCCESS;
    };
    for (name, text) in &files {
        let path = dir.join(name);
        if let Err(err) = std::fs::write(&path, text) {
            eprintln!("proxyplan-crdgen: writing {}: {err}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
