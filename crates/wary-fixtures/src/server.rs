//! A test server: a `TcpListener` on 127.0.0.1, one thread accepting and one per connection;
//! each connection's handler returns what it saw, and [`Server::stop`] hands all of it back.

use std::io::{self, ErrorKind, Read};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long a connection handler waits for request bytes.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest any handler lingers on a connection.
pub const HANDLER_LIFETIME: Duration = Duration::from_secs(60);

/// A running server whose handlers return a `T` per connection.
pub struct Server<T> {
    /// The port on 127.0.0.1.
    pub port: u16,
    done: Arc<AtomicBool>,
    acceptor: JoinHandle<Vec<T>>,
}

impl<T: Send + 'static> Server<T> {
    /// Binds a free port and serves each connection with `handler`, which gets the stream
    /// (blocking, with [`READ_TIMEOUT`]) and the run's end flag.
    pub fn start<F>(handler: F) -> io::Result<Self>
    where
        F: Fn(TcpStream, &AtomicBool) -> T + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let done = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&done);
        let handler = Arc::new(handler);
        let acceptor = thread::spawn(move || accept_loop(&listener, &handler, &stop));
        Ok(Self { port, done, acceptor })
    }

    /// Stops accepting, lets every handler finish, and returns what each connection saw.
    pub fn stop(self) -> Vec<T> {
        self.done.store(true, Ordering::SeqCst);
        self.acceptor.join().unwrap_or_default()
    }
}

fn accept_loop<T, F>(listener: &TcpListener, handler: &Arc<F>, done: &Arc<AtomicBool>) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(TcpStream, &AtomicBool) -> T + Send + Sync + 'static,
{
    let seen = Arc::new(Mutex::new(vec![]));
    let mut handlers = vec![];
    while !done.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let seen = Arc::clone(&seen);
                let done = Arc::clone(done);
                let handler = Arc::clone(handler);
                handlers.push(thread::spawn(move || {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
                    let saw = handler(stream, &done);
                    if let Ok(mut all) = seen.lock() {
                        all.push(saw);
                    }
                }));
            }
            Err(err) if err.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
            Err(_) => thread::sleep(Duration::from_millis(5)),
        }
    }
    for handler in handlers {
        let _ = handler.join();
    }
    Arc::try_unwrap(seen).ok().and_then(|m| m.into_inner().ok()).unwrap_or_default()
}

/// Keeps the connection until the device closes it or the run ends, so the server's close never
/// races the device's reading. Polls the end flag at the stream's read timeout.
pub fn linger_until_closed<S: Read>(stream: &mut S, done: &AtomicBool) {
    let started = Instant::now();
    let mut buf = [0u8; 256];
    while !done.load(Ordering::SeqCst) && started.elapsed() < HANDLER_LIFETIME {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// A port on 127.0.0.1 with no listener: bound, then released (a small race with other
/// processes, acceptable for a test).
pub fn closed_port() -> io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn each_connection_is_handed_back_once_stopped() {
        let server = Server::start(|mut stream: TcpStream, _: &AtomicBool| {
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).map(|()| byte[0]).ok()
        })
        .unwrap();
        for b in [7u8, 9] {
            let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
            stream.write_all(&[b]).unwrap();
        }
        // Both handlers finish before stop returns: it joins them.
        thread::sleep(Duration::from_millis(100));
        let mut seen = server.stop();
        seen.sort_unstable();
        assert_eq!(seen, [Some(7), Some(9)]);
    }
}
