//! `proxyplan-e2e-forward LISTEN SOCKET`: accepts TCP on LISTEN (e.g. `127.0.0.1:6443`)
//! and connects each client to the Unix socket SOCKET, until killed.
//!
//! The end-to-end suite runs it inside each agent's network namespace so that the agent
//! reaches the API server through the suite (see `proxyplan_tests::e2e::forward`). It
//! prints one line, starting with `proxyplan-e2e-forward: listening`, once it listens.

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;

use proxyplan_tests::e2e::forward::{READY_LINE, tcp_to_unix};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, socket] = args.as_slice() else {
        eprintln!("usage: proxyplan-e2e-forward LISTEN-ADDRESS UNIX-SOCKET");
        return ExitCode::from(2);
    };
    let listener = match TcpListener::bind(listen) {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!("proxyplan-e2e-forward: listen on {listen}: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{READY_LINE} on {listen}")
        .and_then(|()| out.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    drop(out);
    tcp_to_unix(&listener, &PathBuf::from(socket))
}
