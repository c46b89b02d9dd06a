//! A started program read until it says it is ready: its standard output read line by line on
//! a thread of its own until a line holds the ready text, each line within a bound, and drained
//! after that so that the program never blocks on a full pipe. The end-to-end harness (which
//! panics) and the benchmark (which reports an error) both start their processes through it.

use std::io::{BufRead as _, BufReader};
use std::process::ChildStdout;
use std::sync::mpsc;
use std::time::Duration;

/// Why a program was not ready: it closed its output or stayed silent past the bound. The lines
/// it printed until then are kept.
#[derive(Debug)]
pub struct NotReady {
    /// Every line printed before it gave up.
    pub lines: Vec<String>,
    /// It closed its standard output (it exited, most likely), rather than falling silent.
    pub closed: bool,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = if self.closed { "closed its output" } else { "fell silent" };
        write!(f, "{how} before it was ready; printed {:?}", self.lines)
    }
}

impl std::error::Error for NotReady {}

/// Reads `stdout` until a line contains `ready` and returns every line up to and including it;
/// [`NotReady`] when the output closes first or no line comes within `silence`. The rest of the
/// output is read and dropped on the same thread while the program runs.
pub fn read_until_ready(
    stdout: ChildStdout,
    ready: &str,
    silence: Duration,
) -> Result<Vec<String>, NotReady> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // Once nobody waits, the lines are only drained.
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    loop {
        match rx.recv_timeout(silence) {
            Ok(line) => {
                let done = line.contains(ready);
                lines.push(line);
                if done {
                    return Ok(lines);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => return Err(NotReady { lines, closed: false }),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(NotReady { lines, closed: true });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use super::read_until_ready;

    fn shell(script: &str) -> std::process::Child {
        Command::new("sh").args(["-c", script]).stdout(Stdio::piped()).spawn().expect("sh")
    }

    #[test]
    fn the_lines_up_to_the_ready_one_come_back_and_the_rest_is_drained() {
        let mut child = shell("echo starting; echo listening on 127.0.0.1:1; seq 1 100000");
        let stdout = child.stdout.take().expect("piped");
        let lines =
            read_until_ready(stdout, "listening on", Duration::from_secs(20)).expect("ready");
        assert_eq!(lines, ["starting", "listening on 127.0.0.1:1"]);
        // Drained: the program writes its 600 kB and exits, never blocked on the pipe.
        assert!(child.wait().expect("exit").success());
    }

    #[test]
    fn a_program_that_exits_or_falls_silent_is_not_ready() {
        let mut child = shell("echo oops");
        let stdout = child.stdout.take().expect("piped");
        let why = read_until_ready(stdout, "ready", Duration::from_secs(20)).expect_err("exited");
        assert!(why.closed);
        assert_eq!(why.lines, ["oops"]);
        let _ = child.wait();
        let mut child = shell("echo waiting; sleep 5");
        let stdout = child.stdout.take().expect("piped");
        let why =
            read_until_ready(stdout, "ready", Duration::from_millis(200)).expect_err("silent");
        assert!(!why.closed);
        assert_eq!(why.lines, ["waiting"]);
        let _ = child.kill();
        let _ = child.wait();
    }
}
