//! Byte forwarding between an agent's network namespace and the API server.
//!
//! Unix sockets live in the file system, not in a network namespace, so they cross
//! namespaces where TCP cannot: inside each agent's namespace `proxyplan-e2e-forward`
//! accepts TCP on `127.0.0.1` and connects each client to a Unix socket
//! ([`tcp_to_unix`]); in the host namespace the suite accepts on that socket and connects
//! each client to the API server ([`unix_to_tcp`]). The bytes (TLS included) pass
//! through unchanged.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread;

/// First line `proxyplan-e2e-forward` prints, once it listens.
pub const READY_LINE: &str = "proxyplan-e2e-forward: listening";

/// A stream that can be split into a reading and a writing half.
trait Duplex: Read + Write + Send + Sized + 'static {
    fn split(&self) -> io::Result<Self>;
    fn close_write(&self);
}

impl Duplex for TcpStream {
    fn split(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn close_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl Duplex for UnixStream {
    fn split(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn close_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

/// Copies both directions until both ends closed; half-closes follow through.
fn splice<A: Duplex, B: Duplex>(a: A, b: B) -> io::Result<()> {
    let (mut a_read, mut b_write) = (a.split()?, b.split()?);
    let upstream = thread::spawn(move || {
        let _ = io::copy(&mut a_read, &mut b_write);
        b_write.close_write();
    });
    let (mut b_read, mut a_write) = (b, a);
    let _ = io::copy(&mut b_read, &mut a_write);
    a_write.close_write();
    let _ = upstream.join();
    Ok(())
}

/// Listens on `socket` (replacing a stale file) and connects every client to
/// `host:port`, each on its own threads. Returns once listening; the accept loop runs
/// until the process ends.
///
/// # Errors
/// When the socket cannot be bound.
pub fn unix_to_tcp(socket: &Path, host: String, port: u16) -> io::Result<()> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)?;
    thread::Builder::new()
        .name("e2e-api-forward".to_owned())
        .spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let host = host.clone();
                thread::spawn(move || {
                    if let Ok(server) = TcpStream::connect((host.as_str(), port)) {
                        let _ = splice(client, server);
                    }
                });
            }
        })?;
    Ok(())
}

/// Accepts TCP clients on `listener` and connects each to the Unix socket at `socket`,
/// forever.
pub fn tcp_to_unix(listener: &TcpListener, socket: &Path) -> ! {
    let socket: PathBuf = socket.to_owned();
    loop {
        let Ok((client, _)) = listener.accept() else {
            continue;
        };
        let socket = socket.clone();
        thread::spawn(move || {
            if let Ok(server) = UnixStream::connect(&socket) {
                let _ = splice(client, server);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;

    /// TCP client -> tcp_to_unix -> socket -> unix_to_tcp -> TCP echo server, and back.
    #[test]
    fn bytes_and_half_closes_cross_both_hops() {
        let dir = std::env::temp_dir().join(format!("pp-forward-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("api.sock");

        // An echo server that answers each line upper-cased and closes after EOF.
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo_port = echo.local_addr().unwrap().port();
        thread::spawn(move || {
            for conn in echo.incoming() {
                let conn = conn.unwrap();
                thread::spawn(move || {
                    let mut out = conn.try_clone().unwrap();
                    for line in io::BufReader::new(conn).lines() {
                        let line = line.unwrap();
                        writeln!(out, "{}", line.to_uppercase()).unwrap();
                    }
                    writeln!(out, "bye").unwrap();
                });
            }
        });

        unix_to_tcp(&socket, "127.0.0.1".to_owned(), echo_port).unwrap();
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let front_addr = front.local_addr().unwrap();
        let socket_for_front = socket.clone();
        thread::spawn(move || tcp_to_unix(&front, &socket_for_front));

        for round in 0..3 {
            let mut client = TcpStream::connect(front_addr).unwrap();
            writeln!(client, "hello {round}").unwrap();
            writeln!(client, "again").unwrap();
            client.shutdown(Shutdown::Write).unwrap();
            let mut answer = String::new();
            client.read_to_string(&mut answer).unwrap();
            assert_eq!(answer, format!("HELLO {round}\nAGAIN\nbye\n"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
