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
// Latin word in Chinese text), which must occur in both questions.
//
// The check is deliberately one-sided: it may reject a real paraphrase ("two" against "a
// couple of", 2FA against two-factor), which costs one model call, and it must not let a
// changed detail through, which would serve a wrong answer.
package nearmiss
