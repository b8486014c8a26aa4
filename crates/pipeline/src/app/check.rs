//! The program's checker: how a processed frame read back through a read
//! lease is verified, for the source it came from.

use std::time::Instant;

use crate::camera::{frame_threads, TestPattern};

/// How the program verifies a processed frame.
#[derive(Clone, Copy, Debug)]
pub enum Checker {
    /// The sensor model's frames: the consumer counted the bytes that
    /// differ from the frame's test pattern (must be none), and the
    /// processed frame is that pattern with every byte inverted.
    Pattern {
        /// Bytes per line.
        stride: usize,
    },
    /// A source that gives a digest of each frame as it produced it
    /// ([`crate::source::Filled::digest`]): the frame's bytes after the
    /// work must have that digest under `digest` (for work that leaves the
    /// frame's bytes as they came, or a digest that undoes the work). The
    /// consumer's count is not a check here.
    Digest {
        /// The digest function (the source's own).
        digest: fn(&[u8]) -> u64,
    },
}

impl Checker {
    /// Whether the consumer's mismatch count is a check of the frame.
    pub fn counts_consumer(&self) -> bool {
        matches!(self, Checker::Pattern { .. })
    }

    /// Checks frame `frame`'s processed `bytes` (`expected`: the digest the
    /// source gave, where it gave one); `Err` says what was wrong. Returns
    /// the time the check took, in nanoseconds.
    pub fn check(
        &self,
        frame: u64,
        bytes: &[u8],
        expected: Option<u64>,
    ) -> (Result<(), String>, u64) {
        let began = Instant::now();
        let result = match *self {
            Checker::Pattern { stride } => {
                let threads = frame_threads(bytes.len());
                match TestPattern::new(frame, stride).first_mismatch_parallel(bytes, 0xff, threads)
                {
                    None => Ok(()),
                    Some(at) => Err(format!("processed bytes read back wrong at offset {at}")),
                }
            }
            Checker::Digest { digest } => match expected {
                None => Err("the source gave no digest for it".to_string()),
                Some(want) => match digest(bytes) {
                    got if got == want => Ok(()),
                    got => Err(format!(
                        "digest {got:#018x} after the work, the source gave {want:#018x}"
                    )),
                },
            },
        };
        (result, began.elapsed().as_nanos() as u64)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sum(b: &[u8]) -> u64 {
        b.iter().map(|&x| u64::from(x)).sum()
    }

    #[test]
    fn each_checker_finds_a_wrong_frame() {
        let c = Checker::Pattern { stride: 16 };
        let mut bytes = vec![0u8; 64];
        TestPattern::new(3, 16).fill(&mut bytes);
        bytes.iter_mut().for_each(|b| *b = !*b);
        assert!(c.check(3, &bytes, None).0.is_ok());
        bytes[9] ^= 1;
        assert!(c.check(3, &bytes, None).0.unwrap_err().contains("offset 9"));
        assert!(c.counts_consumer());
        let d = Checker::Digest { digest: sum };
        assert!(d.check(0, &[1, 2], Some(3)).0.is_ok());
        assert!(d.check(0, &[1, 2], Some(4)).0.is_err());
        assert!(d.check(0, &[1, 2], None).0.is_err());
        assert!(!d.counts_consumer());
    }
}
