//! Minimal `--flag value` / `--flag=value` argument reader (keeps clap out of the build).

use anyhow::{anyhow, bail, Context, Result};
use std::str::FromStr;

/// A cursor over command-line arguments.
pub struct Args {
    items: Vec<String>,
    pos: usize,
    pending_value: Option<String>,
}

impl Args {
    /// Wraps the given arguments (without the program name).
    pub fn new(items: Vec<String>) -> Self {
        Self {
            items,
            pos: 0,
            pending_value: None,
        }
    }

    /// Next flag name (e.g. `--max-running`), splitting off an inline `=value`.
    pub fn next_flag(&mut self) -> Result<Option<String>> {
        if let Some(v) = self.pending_value.take() {
            bail!("unexpected value {v:?}");
        }
        let Some(item) = self.items.get(self.pos).cloned() else {
            return Ok(None);
        };
        self.pos += 1;
        if !item.starts_with("--") {
            bail!("unexpected argument {item:?}");
        }
        match item.split_once('=') {
            Some((flag, value)) => {
                self.pending_value = Some(value.to_string());
                Ok(Some(flag.to_string()))
            }
            None => Ok(Some(item)),
        }
    }

    /// The value of the flag just read.
    pub fn value(&mut self, flag: &str) -> Result<String> {
        if let Some(v) = self.pending_value.take() {
            return Ok(v);
        }
        let v = self
            .items
            .get(self.pos)
            .cloned()
            .ok_or_else(|| anyhow!("{flag} needs a value"))?;
        self.pos += 1;
        Ok(v)
    }

    /// The value of the flag just read, parsed.
    pub fn parse<T: FromStr>(&mut self, flag: &str) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        let v = self.value(flag)?;
        v.parse::<T>()
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("bad value {v:?} for {flag}"))
    }
}
