//! Mutants of a JSON value rather than of its bytes: most byte mutants of a
//! message are not JSON at all, so a reader's checks past the syntax (names,
//! schemas, ids, members missing or of the wrong type) need these.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

/// Strings a reader of names, URIs and text should not trust.
fn hostile_string(rng: &mut StdRng) -> String {
    let choices: [&str; 18] = [
        "",
        " ",
        "\0",
        "a\nb",
        "\r\n",
        "\u{202e}evil",
        "\u{fffd}",
        "😀",
        "__",
        "h__x",
        "a+b",
        "../../etc/passwd",
        "{id}",
        "x://{a}{b}",
        "%00%ff",
        "\\ud800",
        "-9223372036854775808",
        "null",
    ];
    match rng.random_range(0..4) {
        0 => "x".repeat(rng.random_range(1..70_000)),
        1 => choices[rng.random_range(0..choices.len())].repeat(rng.random_range(1..40)),
        _ => choices[rng.random_range(0..choices.len())].to_string(),
    }
}

fn hostile_value(rng: &mut StdRng) -> Value {
    match rng.random_range(0..12) {
        0 => Value::Null,
        1 => Value::Bool(rng.random_bool(0.5)),
        2 => json!(i64::MIN),
        3 => json!(u64::MAX),
        4 => json!(-0.0),
        5 => json!(1e300),
        6 => Value::Array(Vec::new()),
        7 => Value::Object(Map::new()),
        // As deep as a reader of the message allows (serde_json: 128).
        8 => {
            let mut value = json!(1);
            for _ in 0..rng.random_range(1..120) {
                value = json!([value]);
            }
            value
        }
        9 => json!({"type": "object", "properties": {hostile_string(rng): {"type": "string"}}}),
        _ => Value::String(hostile_string(rng)),
    }
}

/// How many nodes `value` has, itself included.
fn nodes(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(nodes).sum(),
        Value::Object(members) => members.values().map(nodes).sum(),
        _ => 0,
    }
}

/// The `index`th node in pre-order.
fn node_mut(value: &mut Value, mut index: usize) -> &mut Value {
    if index == 0 {
        return value;
    }
    index -= 1;
    let children: Vec<&mut Value> = match value {
        Value::Array(items) => items.iter_mut().collect(),
        Value::Object(members) => members.values_mut().collect(),
        _ => Vec::new(),
    };
    for child in children {
        let size = nodes(child);
        if index < size {
            return node_mut(child, index);
        }
        index -= size;
    }
    unreachable!("the index is below the node count")
}

fn mutate(value: &mut Value, rng: &mut StdRng) {
    let at = rng.random_range(0..nodes(value));
    let node = node_mut(value, at);
    match (rng.random_range(0..6), node) {
        // A member gone, or named otherwise.
        (0, Value::Object(members)) if !members.is_empty() => {
            let key = members
                .keys()
                .nth(rng.random_range(0..members.len()))
                .cloned();
            if let Some(key) = key {
                let moved = members.shift_remove(&key);
                if let (true, Some(moved)) = (rng.random_bool(0.5), moved) {
                    members.insert(hostile_string(rng), moved);
                }
            }
        }
        // An element twice (a duplicate name), or gone.
        (1, Value::Array(items)) if !items.is_empty() => {
            let index = rng.random_range(0..items.len());
            if rng.random_bool(0.7) {
                let copy = items[index].clone();
                items.insert(index, copy);
            } else {
                items.remove(index);
            }
        }
        // Wrapped in an array or an object.
        (2, node) => {
            let inner = node.take();
            *node = if rng.random_bool(0.5) {
                json!([inner])
            } else {
                json!({ "value": inner })
            };
        }
        (_, node) => *node = hostile_value(rng),
    }
}

/// `count` mutants of `seed`, each changed in one to three places, serialised.
pub fn value_mutants(seed: &Value, count: usize, rng_seed: u64) -> Vec<Vec<u8>> {
    let mut rng = StdRng::seed_from_u64(rng_seed);
    (0..count)
        .map(|_| {
            let mut value = seed.clone();
            for _ in 0..rng.random_range(1..=3) {
                mutate(&mut value, &mut rng);
            }
            serde_json::to_vec(&value).unwrap_or_default()
        })
        .collect()
}
