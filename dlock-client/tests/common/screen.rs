//! The real `dlock` in a pseudo-terminal, its screen read back through a
//! terminal emulator (vt100), for the full-screen `dlock top`.

use super::PATIENCE;
use portable_pty::{native_pty_system, ChildKiller, CommandBuilder, PtySize};
use std::io::{Read, Write};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// `dlock` running in a terminal of its own.
pub struct Screen {
    parser: vt100::Parser,
    output: mpsc::Receiver<Vec<u8>>,
    input: Box<dyn Write + Send>,
    child: Option<Box<dyn portable_pty::Child + Send + Sync>>,
    killer: Box<dyn ChildKiller + Send + Sync>,
}

impl Screen {
    /// Starts `dlock ARGS` against `server` in a `rows` × `cols` terminal.
    pub fn start(server: &str, args: &[&str], rows: u16, cols: u16) -> Screen {
        let pair = native_pty_system()
            .openpty(PtySize {
                rows,
                cols,
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("a pseudo-terminal");
        let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_dlock"));
        cmd.args(args);
        cmd.env("DLOCK_SERVER", server);
        cmd.env("TERM", "xterm-256color");
        cmd.env_remove("DLOCK_TOKEN");
        let child = pair.slave.spawn_command(cmd).expect("dlock starts");
        drop(pair.slave);
        let killer = child.clone_killer();
        let mut reader = pair.master.try_clone_reader().expect("pty reader");
        let input = pair.master.take_writer().expect("pty writer");
        // The master must stay open while dlock runs; the reader thread
        // owns it and ends at end of file (dlock gone) or when the test
        // stops listening.
        let (tx, output) = mpsc::channel(64);
        std::thread::spawn(move || {
            let _master = pair.master;
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = reader.read(&mut buf) {
                if tx.blocking_send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Screen {
            parser: vt100::Parser::new(rows, cols, 0),
            output,
            input,
            child: Some(child),
            killer,
        }
    }

    /// What the screen shows now, a line per row.
    pub fn contents(&self) -> String {
        self.parser.screen().contents()
    }

    /// Whether the program has the alternate screen (a full-screen view).
    pub fn alternate(&self) -> bool {
        self.parser.screen().alternate_screen()
    }

    /// Reads the program's output until `ok` holds for the screen; panics
    /// with the screen after PATIENCE.
    pub async fn wait_for(&mut self, what: &str, ok: impl Fn(&Screen) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !ok(self) {
            match tokio::time::timeout_at(deadline, self.output.recv()).await {
                Ok(Some(bytes)) => self.parser.process(&bytes),
                Ok(None) => panic!("dlock ended before {what}:\n{}", self.contents()),
                Err(_) => panic!("never {what}; the screen:\n{}", self.contents()),
            }
        }
    }

    /// Types `keys`.
    pub fn send(&mut self, keys: &[u8]) {
        self.input.write_all(keys).expect("typed");
        self.input.flush().expect("typed");
    }

    /// Waits for dlock to exit, reading what it draws on the way out, and
    /// returns its exit code.
    pub async fn exit_code(&mut self) -> u32 {
        let mut child = self.child.take().expect("still running");
        let waited = tokio::task::spawn_blocking(move || child.wait());
        let status = tokio::time::timeout(PATIENCE, waited)
            .await
            .expect("dlock exits")
            .expect("joined")
            .expect("waited");
        // Once dlock is gone the terminal's last reader sees its end: the
        // channel closes after the last of the output.
        while let Some(bytes) = tokio::time::timeout(PATIENCE, self.output.recv())
            .await
            .expect("the terminal closes")
        {
            self.parser.process(&bytes);
        }
        status.exit_code()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.killer.kill();
        }
    }
}
