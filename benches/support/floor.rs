//! The floor responder: the least a process can do to answer an agent-check.
//! One thread, one epoll set (mio, edge-triggered), no timers, no lookup, no
//! metrics: accept, read until LF, write a constant `ready 100%\n`, close.
//! The agent's cost per check is reported as a multiple of this one's.

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

/// The constant reply.
pub const REPLY: &[u8] = b"ready 100%\n";

const LISTENER: Token = Token(usize::MAX);
const MAX_LINE: usize = 1024;

struct Conn {
    stream: TcpStream,
    buf: [u8; MAX_LINE],
    filled: usize,
}

/// What reading did to a connection.
enum Step {
    /// Wait for more bytes.
    Pending,
    /// Done (answered, closed by the peer, or failed): drop it.
    Close,
}

fn on_readable(conn: &mut Conn) -> Step {
    loop {
        if conn.filled == MAX_LINE {
            return Step::Close;
        }
        match conn.stream.read(&mut conn.buf[conn.filled..]) {
            Ok(0) => return Step::Close,
            Ok(n) => {
                let new = &conn.buf[conn.filled..conn.filled + n];
                conn.filled += n;
                if new.contains(&b'\n') {
                    // 11 bytes into an empty send buffer: one write suffices.
                    let _ = conn.stream.write(REPLY);
                    return Step::Close;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Pending,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return Step::Close,
        }
    }
}

/// Serves on `addr` until the process is killed.
pub fn serve(addr: SocketAddr) -> ! {
    let mut poll = Poll::new().expect("epoll");
    let mut events = Events::with_capacity(1024);
    let mut listener = TcpListener::bind(addr).expect("bind the floor listener");
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .expect("register the listener");
    // A slab: connection i lives at conns[i]; free slots are reused.
    let mut conns: Vec<Option<Box<Conn>>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    loop {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            panic!("epoll_wait: {e}");
        }
        for event in &events {
            if event.token() == LISTENER {
                loop {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let slot = free.pop().unwrap_or_else(|| {
                                conns.push(None);
                                conns.len() - 1
                            });
                            let mut conn = Box::new(Conn {
                                stream,
                                buf: [0; MAX_LINE],
                                filled: 0,
                            });
                            if poll
                                .registry()
                                .register(&mut conn.stream, Token(slot), Interest::READABLE)
                                .is_ok()
                            {
                                conns[slot] = Some(conn);
                            } else {
                                free.push(slot);
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(_) => break,
                    }
                }
                continue;
            }
            let slot = event.token().0;
            let Some(conn) = conns.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if let Step::Close = on_readable(conn) {
                // Dropping the stream closes it (and removes it from epoll).
                conns[slot] = None;
                free.push(slot);
            }
        }
    }
}

/// The same floor on a current-thread tokio runtime: accept with tokio,
/// then read and answer on the plain socket when the line is already there
/// (a task per connection otherwise). Separates the runtime's cost from the
/// agent's own work.
pub fn serve_tokio(addr: SocketAddr) -> ! {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind the floor listener");
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let Ok(std_stream) = stream.into_std() else {
                continue;
            };
            let mut buf = [0u8; MAX_LINE];
            let filled = match (&std_stream).read(&mut buf) {
                Ok(n) if buf[..n].contains(&b'\n') => {
                    let _ = (&std_stream).write(REPLY);
                    continue;
                }
                Ok(0) => continue,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => 0,
                Err(_) => continue,
            };
            let Ok(mut stream) = tokio::net::TcpStream::from_std(std_stream) else {
                continue;
            };
            tokio::spawn(async move {
                let mut filled = filled;
                while !buf[..filled].contains(&b'\n') && filled < MAX_LINE {
                    match stream.read(&mut buf[filled..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => filled += n,
                    }
                }
                let _ = stream.write_all(REPLY).await;
            });
        }
    });
    unreachable!("the floor serves until killed")
}
