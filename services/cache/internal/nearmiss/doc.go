// Package nearmiss rejects cache candidates that are close in wording but differ in a
// detail that changes the answer: a number, a date, a negation, a quoted string or a named
// thing. "How do I return an iPhone 15?" and "How do I return an iPhone 14?" are almost the
// same string and have different answers; so have "为什么不能退款" and "为什么能退款". No
// similarity score can be trusted with that difference, so the check runs on every
// candidate, whatever its score.
//
// What counts, in English and Chinese: numbers (digits with separators, Chinese numerals
// such as 十五 or 两千五百, number words such as two or twelve, ordinals), dates (months,
// weekdays, today/明天/下周, 3月/5号, 3 pm), negations (not, no, never, n't, cannot, 不, 没,
// 未, 非, 无, 勿, 莫, 否; A-not-A questions such as 能不能 and words such as 非常 or 未来 do
// not count), quoted strings ("", “”, 「」, 《》 ...), and names (iPhone, AWS, Netflix, a
// Latin word in Chinese text), which must occur in both questions. Also: the sign of a
// number (-5, 负5, 零下20度), arithmetic operators and expressions as written (200/15,
// 2加3), currencies and units ($, €, 美元, km, 公斤, 3天), emoji (by polarity where known: 👍
// and ✅ agree, 👍 and 👎 do not), directions and roles (from A to B, to B from A, A→B,
// units in order, 从A到B, A兑B, A比B), and opposite words from the bilingual lexicon in
// opposites.txt (maximum/minimum, 儿童/成人, 退货/换货): a question that says one side of an
// axis where the other says another side disagrees with it.
//
// The check is deliberately one-sided: it may reject a real paraphrase ("two" against "a
// couple of", 2FA against two-factor), which costs one model call, and it must not let a
// changed detail through, which would serve a wrong answer.
package nearmiss
