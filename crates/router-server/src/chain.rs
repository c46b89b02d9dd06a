//! An error and its causes, outermost first, as one line of text: the one place a cause
//! becomes text (a client's error message, a configuration problem, a log line).

use std::fmt;

/// An error and its causes, outermost first, joined by `": "`.
pub(crate) struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(inner) = cause {
            write!(f, ": {inner}")?;
            cause = inner.source();
        }
        Ok(())
    }
}
