//! Text to search terms: words split at punctuation and at snake_case, kebab-case
//! and camelCase joints, lowercased, stop words dropped, and stemmed (Snowball
//! English, so "files", "filed" and "filing" meet "file").

use rust_stemmers::{Algorithm, Stemmer};

/// Words too common in tool texts and questions to tell tools apart. Short on
/// purpose: "get", "list", "create" and the like carry meaning here.
const STOP_WORDS: &[&str] = &[
    "a", "about", "all", "an", "and", "any", "are", "as", "at", "be", "been", "but", "by", "can",
    "could", "do", "does", "for", "from", "has", "have", "how", "i", "if", "in", "into", "is",
    "it", "its", "me", "my", "of", "on", "or", "our", "please", "should", "so", "some", "than",
    "that", "the", "their", "them", "then", "there", "these", "this", "those", "to", "us", "was",
    "we", "were", "what", "when", "where", "which", "while", "who", "will", "with", "would", "you",
    "your",
];

/// Turns text into terms; one per thread of use (the stemmer is cheap to make).
pub struct Analyzer {
    stemmer: Stemmer,
    word: String,
}

impl Default for Analyzer {
    fn default() -> Analyzer {
        Analyzer {
            stemmer: Stemmer::create(Algorithm::English),
            word: String::new(),
        }
    }
}

impl Analyzer {
    /// Calls `term` with each term of `text`, in order (repeats included).
    pub fn terms(&mut self, text: &str, mut term: impl FnMut(&str)) {
        for run in text.split(|c: char| !c.is_alphanumeric()) {
            if run.is_empty() {
                continue;
            }
            for piece in split_case(run) {
                self.word.clear();
                self.word.extend(piece.chars().flat_map(char::to_lowercase));
                if is_stop_word(&self.word) {
                    continue;
                }
                let stemmed = self.stemmer.stem(&self.word);
                if !stemmed.is_empty() {
                    term(&stemmed);
                }
            }
        }
    }

    /// Calls `term` with each pair of adjacent words of `text` written as one and
    /// stemmed: a query's "check out", "sign in" or "data base" meets a tool's
    /// `checkout`, `signin` or `database`, which the split of names cannot undo.
    /// Stop words take part here ("sign in"); words pair up across one separating
    /// character, not across a comma and a space.
    pub fn compounds(&mut self, text: &str, mut term: impl FnMut(&str)) {
        let mut previous = String::new();
        for word in text.split(|c: char| !c.is_alphanumeric()) {
            if word.is_empty() {
                previous.clear();
                continue;
            }
            let lower: String = word.chars().flat_map(char::to_lowercase).collect();
            if !previous.is_empty() && lower.chars().all(char::is_alphabetic) {
                self.word.clear();
                self.word.push_str(&previous);
                self.word.push_str(&lower);
                let stemmed = self.stemmer.stem(&self.word);
                term(&stemmed);
            }
            previous = if lower.chars().all(char::is_alphabetic) {
                lower
            } else {
                String::new()
            };
        }
    }

    /// The terms of `text`, collected.
    pub fn collect(&mut self, text: &str) -> Vec<String> {
        let mut terms = Vec::new();
        self.terms(text, |term| terms.push(term.to_string()));
        terms
    }
}

fn is_stop_word(word: &str) -> bool {
    STOP_WORDS.binary_search(&word).is_ok()
}

/// Splits a run of letters and digits at its case and digit joints: `getHTTPStatus2`
/// → `get`, `HTTP`, `Status`, `2`.
fn split_case(run: &str) -> impl Iterator<Item = &str> {
    let chars: Vec<(usize, char)> = run.char_indices().collect();
    let mut cuts = vec![0];
    for pair in 1..chars.len() {
        let (at, current) = chars[pair];
        let previous = chars[pair - 1].1;
        let next_lower = chars.get(pair + 1).is_some_and(|(_, c)| c.is_lowercase());
        let cut = (previous.is_lowercase() && current.is_uppercase())
            || (previous.is_uppercase() && current.is_uppercase() && next_lower)
            || (previous.is_alphabetic() != current.is_alphabetic());
        if cut {
            cuts.push(at);
        }
    }
    cuts.push(run.len());
    (0..cuts.len() - 1).filter_map(move |i| run.get(cuts[i]..cuts[i + 1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_words_are_sorted_for_binary_search() {
        assert!(STOP_WORDS.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn names_split_at_every_joint_and_words_are_stemmed() {
        let mut analyzer = Analyzer::default();
        assert_eq!(
            analyzer.collect("get_current-time getHTTPStatus2 listFiles"),
            ["get", "current", "time", "get", "http", "status", "2", "list", "file"]
        );
        assert_eq!(
            analyzer.collect("Reads the files of a directory, recursively."),
            ["read", "file", "directori", "recurs"]
        );
        assert_eq!(analyzer.collect("the of and"), Vec::<String>::new());
        let mut compounds = Vec::new();
        analyzer.compounds("check out, sign in 2 data-bases", |term| {
            compounds.push(term.to_string())
        });
        assert_eq!(compounds, ["checkout", "signin", "databas"]);
        assert_eq!(
            analyzer.collect("Übersetzung naïve"),
            ["übersetzung", "naïv"]
        );
    }
}
