//! The /metrics endpoint: a plain HTTP/1.1 responder on one thread (a scrape every 15–60 s
//! needs no more). Bound before anything is attached, so a port in use fails fast. The format
//! follows the request's `Accept` header (`exposition`).

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex},
    time::Duration,
};

use super::{Snapshot, encode, exposition};

#[derive(Debug, thiserror::Error)]
// The io error is the source, printed after this by the error chain (main).
#[error("cannot listen on {addr} (set `listen` in the config, or stop what holds it)")]
pub struct ListenError {
    pub addr: SocketAddr,
    pub source: std::io::Error,
}

pub fn serve(addr: SocketAddr, snapshot: Arc<Mutex<Snapshot>>) -> Result<SocketAddr, ListenError> {
    let listener = TcpListener::bind(addr).map_err(|source| ListenError { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    std::thread::Builder::new()
        .name("wedgeprobe-http".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = respond(stream, &snapshot);
            }
        })
        .map_err(|source| ListenError { addr, source })?;
    Ok(bound)
}

fn respond(mut stream: TcpStream, snapshot: &Mutex<Snapshot>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    // The request's head, up to its blank line (a client may send it in several writes),
    // at most 4 KiB.
    let mut buf = [0u8; 4096];
    let mut n = 0;
    while n < buf.len() {
        let got = stream.read(&mut buf[n..])?;
        if got == 0 {
            break;
        }
        n += got;
        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let request = String::from_utf8_lossy(&buf[..n]);
    let path = request.split_whitespace().nth(1).unwrap_or("/");
    let (status, ctype, body) = if path == "/metrics" || path.starts_with("/metrics?") {
        let snap = snapshot.lock().map(|s| s.clone()).unwrap_or_default();
        // OpenMetrics when asked for (Prometheus servers ask), else the classic text format.
        if exposition::wants_openmetrics(&request) {
            ("200 OK", exposition::OPENMETRICS, encode(&snap))
        } else {
            (
                "200 OK",
                exposition::TEXT_004,
                exposition::to_text_004(&encode(&snap)),
            )
        }
    } else if path == "/" {
        (
            "200 OK",
            "text/plain",
            "wedgeprobe daemon: metrics at /metrics\n".to_string(),
        )
    } else {
        ("404 Not Found", "text/plain", "not found\n".to_string())
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}
