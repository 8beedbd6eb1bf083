//! The watcher's own rules: what confirms an answer, the backoff.

use super::*;

#[test]
fn an_answer_is_confirmed_until_the_next_prefix_read() {
    assert!(confirming(&Request::Key {
        key: "web/s1".into(),
        stale: false
    }));
    assert!(confirming(&Request::ReadCheck { stale: true }));
    assert!(!confirming(&Request::Prefix {
        index: 9,
        stale: false
    }));
    assert!(!confirming(&Request::AclProbe));
}

#[test]
fn backoff_doubles_to_the_cap_with_jitter_in_the_upper_half() {
    let b = Backoff::default();
    assert_eq!(b.delay(1, 1.0), Duration::from_millis(250));
    assert_eq!(b.delay(1, 0.0), Duration::from_millis(125));
    assert_eq!(b.delay(3, 1.0), Duration::from_millis(1000));
    assert_eq!(b.delay(6, 1.0), Duration::from_secs(8));
    assert_eq!(b.delay(100, 1.0), Duration::from_secs(10));
    assert_eq!(b.delay(100, 0.0), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn backoff_sleeps_are_what_delay_says() {
    let b = Backoff::default();
    let start = tokio::time::Instant::now();
    for failures in 1..=8 {
        tokio::time::sleep(b.delay(failures, 1.0)).await;
    }
    // 0.25 + 0.5 + 1 + 2 + 4 + 8 + 10 + 10 (capped)
    assert_eq!(start.elapsed(), Duration::from_millis(35_750));
}
