//! llama.cpp's `clean_spaces` post-pass of detokenization (HF's
//! `clean_up_tokenization_spaces`), ported pass by pass on bytes so that its
//! quirks stay identical.

pub(crate) fn clean_spaces(text: &mut Vec<u8>) {
    // Pass 1: " ?", " !", " .", " ," lose the space.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);

    // Pass 2: " ' " becomes "'".
    let n = text.len();
    let mut total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0; // the next space is skipped (and seen as NUL by the next step)
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    text.truncate(total);

    // Pass 3: " 's", " 'm", " 're", " 've" lose the space.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            let x2 = text.get(i + 2).copied().filter(|_| i + 2 < n);
            if matches!(x1, b's' | b'm') || matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e'))) {
                total -= 1;
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

#[cfg(test)]
mod tests {
    use super::clean_spaces;

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_spaces(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn matches_llama_cpp_rules() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("a ' b"), "a'b");
        assert_eq!(clean("it 's we 're I 'll they 've don 't"), "it's we're I 'll they've don 't");
        assert_eq!(clean(""), "");
        assert_eq!(clean(" ."), ".");
    }
}
