//! How `dusk` fails: the error kinds that pick the exit status, and the one report of an
//! error and its causes that `main` prints.

use std::fmt;

/// Exit status of success.
pub const EXIT_OK: u8 = 0;
/// Exit status of a command that ran and failed (every config failed, a file could not be
/// written, a kernel did not compile).
pub const EXIT_FAILED: u8 = 1;
/// Exit status of a bad argument, found before any work started (clap's own usage errors
/// exit with 2 as well).
pub const EXIT_USAGE: u8 = 2;
/// Exit status of `tune` and `bench` where no CUDA GPU is usable (and no --interpreter).
pub const EXIT_NO_GPU: u8 = 3;

/// A bad argument value, named as given on the command line (`--out /etc/passwd: exists
/// and is not a directory`).
#[derive(Debug)]
pub struct UsageError(pub String);

/// No CUDA GPU for a command that times kernels on one.
#[derive(Debug)]
pub struct NoGpuError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for NoGpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}
impl std::error::Error for NoGpuError {}

pub type Error = Box<dyn std::error::Error>;

/// A bad argument: exit status 2.
pub fn usage(msg: impl Into<String>) -> Error {
    Box::new(UsageError(msg.into()))
}

/// A failure: exit status 1.
pub fn fail(msg: impl Into<String>) -> Error {
    msg.into().into()
}

/// The exit status `err` ends `dusk` with.
pub fn exit_code(err: &(dyn std::error::Error + 'static)) -> u8 {
    if err.is::<UsageError>() {
        EXIT_USAGE
    } else if err.is::<NoGpuError>() {
        EXIT_NO_GPU
    } else {
        EXIT_FAILED
    }
}

/// `error: <message>`, then one `  caused by: <cause>` line for each cause in the chain that
/// the lines before do not already say: many errors put their source in their own message
/// (`path: File exists`) and return it from `source()` too, and a cause is shown once.
pub fn report(err: &(dyn std::error::Error + 'static)) -> String {
    let mut said = err.to_string();
    let mut out = format!("error: {said}");
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !text.is_empty() && !said.contains(&text) {
            out.push_str(&format!("\n  caused by: {text}"));
            said.push('\n');
            said.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error whose message includes its source, as `thiserror`'s `"{path}: {source}"`.
    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "/etc/passwd: {}", self.0)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// An error whose message does not include its source.
    #[derive(Debug)]
    struct Context(Wrapped);

    impl fmt::Display for Context {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("writing the bundle")
        }
    }

    impl std::error::Error for Context {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_cause_is_reported_once() {
        let io = || std::io::Error::from(std::io::ErrorKind::AlreadyExists);
        let text = report(&Wrapped(io()));
        assert_eq!(text, format!("error: /etc/passwd: {}", io()));
        let text = report(&Context(Wrapped(io())));
        assert_eq!(
            text,
            format!(
                "error: writing the bundle\n  caused by: /etc/passwd: {}",
                io()
            )
        );
    }

    #[test]
    fn the_exit_status_follows_the_kind() {
        assert_eq!(exit_code(&*usage("--out x: bad")), EXIT_USAGE);
        assert_eq!(exit_code(&NoGpuError("none".into())), EXIT_NO_GPU);
        assert_eq!(exit_code(&*fail("it broke")), EXIT_FAILED);
    }
}
