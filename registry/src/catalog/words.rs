//! The words of a part's tool descriptions, each with the tools that have it: what
//! shadowing is found from. Kept as four flat arrays (a few allocations per part,
//! not two per distinct word), since a large catalog has tens of thousands of them;
//! a word's tools are the differences between their places, as LEB128 varints (a
//! byte each, mostly, where a place was four).

use std::collections::{HashMap, HashSet};

/// Distinct words in the order first met, each with the places (among the part's
/// exposed tools) of the tools whose text has it, in tool order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Words {
    /// The words one after another.
    text: String,
    /// Where each word ends in `text`.
    ends: Vec<u32>,
    /// Where each word's tools end in `tools`.
    tool_ends: Vec<u32>,
    /// Per word, its tools' places: the first, then each one's distance from the
    /// one before.
    tools: Vec<u8>,
}

/// The places of one word's tools, read from their varints.
#[derive(Clone)]
pub(super) struct Places<'a> {
    deltas: &'a [u8],
    last: u32,
}

impl Iterator for Places<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.deltas.is_empty() {
            return None;
        }
        // Written by `finish` from places that fit in a u32.
        let delta = leb128::read::unsigned(&mut self.deltas).ok()?;
        self.last = self.last.saturating_add(u32::try_from(delta).ok()?);
        Some(self.last)
    }
}

impl Words {
    /// Each distinct word with its tools.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Places<'_>)> + '_ {
        let mut word_start = 0;
        let mut tools_start = 0;
        self.ends
            .iter()
            .zip(&self.tool_ends)
            .map(move |(&end, &tools_end)| {
                let word = self.text.get(word_start..end as usize).unwrap_or_default();
                let deltas = self
                    .tools
                    .get(tools_start..tools_end as usize)
                    .unwrap_or_default();
                word_start = end as usize;
                tools_start = tools_end as usize;
                (word, Places { deltas, last: 0 })
            })
    }
}

/// Gathers words tool by tool, then packs them.
#[derive(Default)]
pub(super) struct WordsBuilder {
    /// Word -> its place in `words`.
    index: HashMap<Box<str>, usize>,
    /// The words' text and ends, final already; their tools, one vector a word.
    words: Words,
    tools: Vec<Vec<u32>>,
}

impl WordsBuilder {
    /// The words of `texts` (runs of `[A-Za-z0-9_-]`, the characters of a name) are
    /// had by the tool at `place`; places come in increasing order.
    pub fn add(&mut self, place: u32, texts: &[&str]) {
        let mut seen = HashSet::new();
        for word in texts.iter().flat_map(|text| words(text)) {
            if !seen.insert(word) {
                continue;
            }
            match self.index.get(word) {
                Some(&at) => self.tools[at].push(place),
                None => {
                    self.index.insert(word.into(), self.tools.len());
                    self.tools.push(vec![place]);
                    self.words.text.push_str(word);
                    self.words.ends.push(offset(self.words.text.len()));
                }
            }
        }
    }

    pub fn finish(self) -> Words {
        let mut words = self.words;
        words.text.shrink_to_fit();
        words.ends.shrink_to_fit();
        words.tool_ends = Vec::with_capacity(self.tools.len());
        for tools in self.tools {
            let mut last = 0;
            for place in tools {
                // Writing into a `Vec` cannot fail.
                let _ = leb128::write::unsigned(
                    &mut words.tools,
                    u64::from(place.saturating_sub(last)),
                );
                last = place;
            }
            words.tool_ends.push(offset(words.tools.len()));
        }
        words.tools.shrink_to_fit();
        words
    }
}

fn offset(at: usize) -> u32 {
    u32::try_from(at).unwrap_or(u32::MAX)
}

/// The words of a text that could be a name: runs of `[A-Za-z0-9_-]`.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .filter(|word| !word.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_word_once_with_its_tools_in_order() {
        let mut builder = WordsBuilder::default();
        builder.add(0, &["Reads a file.", "read file"]);
        builder.add(1, &["Calls p__other_tool, then reads a file"]);
        builder.add(2, &[""]);
        builder.add(300, &["a file far away"]);
        builder.add(70_000, &["farther"]);
        let words = builder.finish();
        let read: Vec<(&str, Vec<u32>)> = words
            .iter()
            .map(|(word, places)| (word, places.collect()))
            .collect();
        let expected: [(&str, &[u32]); 10] = [
            ("Reads", &[0]),
            ("a", &[0, 1, 300]),
            ("file", &[0, 1, 300]),
            ("read", &[0]),
            ("Calls", &[1]),
            ("p__other_tool", &[1]),
            ("then", &[1]),
            ("reads", &[1]),
            ("far", &[300]),
            ("away", &[300]),
        ];
        let expected: Vec<(&str, Vec<u32>)> = expected
            .iter()
            .map(|(word, places)| (*word, places.to_vec()))
            .chain([("farther", vec![70_000])])
            .collect();
        assert_eq!(read, expected);
        assert_eq!(WordsBuilder::default().finish().iter().count(), 0);
    }
}
