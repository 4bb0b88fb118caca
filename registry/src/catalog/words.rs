//! The words of a part's tool descriptions, each with the tools that have it: what
//! shadowing is found from. Kept as four flat arrays (a few allocations per part,
//! not two per distinct word), since a large catalog has tens of thousands of them.

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
    tools: Vec<u32>,
}

impl Words {
    /// Each distinct word with its tools.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u32])> + '_ {
        let mut word_start = 0;
        let mut tools_start = 0;
        self.ends
            .iter()
            .zip(&self.tool_ends)
            .map(move |(&end, &tools_end)| {
                let word = self.text.get(word_start..end as usize).unwrap_or_default();
                let tools = self
                    .tools
                    .get(tools_start..tools_end as usize)
                    .unwrap_or_default();
                word_start = end as usize;
                tools_start = tools_end as usize;
                (word, tools)
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
        words.tools = Vec::with_capacity(self.tools.iter().map(Vec::len).sum());
        words.tool_ends = Vec::with_capacity(self.tools.len());
        for tools in self.tools {
            words.tools.extend_from_slice(&tools);
            words.tool_ends.push(offset(words.tools.len()));
        }
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
        let words = builder.finish();
        let read: Vec<(&str, &[u32])> = words.iter().collect();
        assert_eq!(
            read,
            [
                ("Reads", &[0][..]),
                ("a", &[0, 1]),
                ("file", &[0, 1]),
                ("read", &[0]),
                ("Calls", &[1]),
                ("p__other_tool", &[1]),
                ("then", &[1]),
                ("reads", &[1]),
            ]
        );
        assert_eq!(WordsBuilder::default().finish().iter().count(), 0);
    }
}
