//! How records travel on the stream: one message carries one or more
//! records as JSON lines (`application/x-ndjson`), so the worker can batch
//! them and other readers (ClickHouse's `JSONEachRow`, `jq`) read them
//! as they are. Pure.

use std::ops::Range;

use super::record::Attempt;

/// The content type of a history message.
pub const CONTENT_TYPE: &str = "application/x-ndjson";
/// A message holds records up to about this many bytes (one record larger
/// than it goes alone): large enough to batch, small enough that one
/// message never costs a reader much memory.
pub const MESSAGE_BYTES: usize = 1024 * 1024;

/// Cuts `lines` (each one serialized record) into runs of at most
/// [`MESSAGE_BYTES`] with their newlines, each run one message; a line
/// larger than that is a run of its own.
pub fn runs(lines: &[Vec<u8>], budget: usize) -> Vec<Range<usize>> {
    let (mut out, mut start, mut bytes) = (vec![], 0, 0);
    for (i, l) in lines.iter().enumerate() {
        let add = l.len() + 1;
        if i > start && bytes + add > budget {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += add;
    }
    if start < lines.len() {
        out.push(start..lines.len());
    }
    out
}

/// One message's body: the lines, each ended by `\n`.
pub fn body(lines: &[Vec<u8>]) -> Vec<u8> {
    let mut b = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    for l in lines {
        b.extend_from_slice(l);
        b.push(b'\n');
    }
    b
}

/// The lines of one message that are not blank: one record each.
pub fn lines(body: &[u8]) -> impl Iterator<Item = &[u8]> + '_ {
    body.split(|b| *b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
}

/// The records of one message; a line that is not a record is an error of
/// its own, the others still read.
pub fn records(body: &[u8]) -> impl Iterator<Item = Result<Attempt, serde_json::Error>> + '_ {
    lines(body).map(serde_json::from_slice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_keep_to_the_budget_and_a_large_line_goes_alone() {
        let l = |n| vec![b'x'; n];
        let lines = vec![l(3), l(3), l(3), l(20), l(1)];
        // 4 bytes each with the newline: two fit in 8.
        assert_eq!(runs(&lines, 8), vec![0..2, 2..3, 3..4, 4..5]);
        assert_eq!(runs(&lines, 1000), vec![0..5]);
        assert!(runs(&[], 8).is_empty());
    }

    #[test]
    fn a_body_reads_back_line_by_line() {
        let a = crate::history::record::sample();
        let line = serde_json::to_vec(&a).unwrap();
        let b = body(&[line.clone(), b"not json".to_vec(), line]);
        assert_eq!(b.iter().filter(|c| **c == b'\n').count(), 3);
        let got: Vec<_> = records(&b).collect();
        assert_eq!(got.len(), 3, "a blank tail is no record");
        assert_eq!(got[0].as_ref().unwrap(), &a);
        assert!(got[1].is_err(), "a bad line is its own error");
        assert_eq!(got[2].as_ref().unwrap(), &a);
    }
}
