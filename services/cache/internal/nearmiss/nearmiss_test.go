package nearmiss

import (
	"slices"
	"testing"
)

// compareCase is one question pair and the reason Compare must give ("" to pass).
type compareCase struct {
	name, query, candidate string
	want                   Reason
}

// runCompareCases checks each case both ways: the check is symmetric, it compares two
// questions and neither is special; and a detail comes exactly with a rejection.
func runCompareCases(t *testing.T, tests []compareCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, detail := Compare(tt.query, tt.candidate)
			if got != tt.want {
				t.Errorf("Compare(%q, %q) = %q (%s), want %q", tt.query, tt.candidate, got, detail, tt.want)
			}
			if back, _ := Compare(tt.candidate, tt.query); back != got {
				t.Errorf("Compare is not symmetric: %q one way, %q the other", got, back)
			}
			if (got == "") != (detail == "") {
				t.Errorf("detail %q with reason %q: want a detail exactly when rejected", detail, got)
			}
		})
	}
}

func TestCompare(t *testing.T) {
	t.Parallel()
	runCompareCases(t, []compareCase{
		// Paraphrases that keep every detail pass.
		{"same words", "How do I reset my password?", "how do i reset my password", ""},
		{"reworded english", "How can I reset my password?", "What's the way to reset a password", ""},
		{"reworded chinese", "怎么重置密码", "密码如何重置", ""},
		{"a-not-a question is not a negation", "能不能退货", "可以退货吗", ""},
		{"有没有 asks", "有没有优惠券", "有优惠券吗", ""},
		{"是否 asks", "是否支持花呗", "支持花呗吗", ""},
		{"lexicalised 非常", "这个非常好用吗", "这个好用吗", ""},
		{"lexicalised 未来", "未来会涨价吗", "以后会涨价吗", ""},
		{"不同 compares", "基础版和专业版有什么区别", "基础版跟专业版有啥不同", ""},
		{"same number, other spelling", "Is shipping free over 1,000 yuan?", "is shipping free above 1000 yuan", ""},
		{"leading zeros", "order 007 status", "order 7 status", ""},
		{"number word and digits", "Can I return it within two weeks?", "can i return it within 2 weeks", ""},
		{"chinese and arabic numerals", "三天内能退吗", "3天内能退吗", ""},
		{"chinese numeral with units", "两千五百元", "2500元", ""},
		{"one as article", "写一封请假邮件", "写请假邮件", ""},
		{"entity in lower case on one side", "How do I return my iPhone?", "how to return an iphone", ""},
		{"latin words in chinese text agree", "iPhone怎么退货", "iphone如何退货", ""},
		{"sentence-initial capital is not a name", "Where is the invoice?", "where can i find the invoice", ""},
		{"contraction is not a quote", "Why don't I get emails", "why do i not get emails", ""},
		{"quote around the whole text is ignored", "「怎么重置密码」", "怎么重置密码", ""},
		{"same quote", `What does "idempotent" mean?`, `meaning of "idempotent"`, ""},
		{"am as a verb", "How am I billed?", "how am i charged", ""},

		// Near misses.
		{"changed number", "How do I return an iPhone 15?", "How do I return an iPhone 14?", Number},
		{"number glued to a word", "rtx4090 price", "rtx4080 price", Number},
		{"added number", "How many days to ship", "How many days to ship 2 items", Number},
		{"changed chinese numeral", "三天内能退吗", "七天内能退吗", Number},
		{"changed decimal", "Is 1.5 mg safe", "Is 2.5 mg safe", Number},
		{"ordinal", "第一期怎么还款", "第二期怎么还款", Number},
		{"changed month", "Is the store open in March?", "Is the store open in April?", Date},
		{"changed weekday", "周一营业吗", "周日营业吗", Date},
		{"weekday spellings agree, days differ", "星期三营业吗", "周五营业吗", Date},
		{"weekday spellings agree", "星期三营业吗", "周三营业吗", ""},
		{"relative day", "明天发货吗", "后天发货吗", Date},
		{"next vs last week", "what happened next week", "what happened last week", Date},
		{"time of day", "Is support open at 9 am", "Is support open at 9 pm", Date},
		{"date unit", "3月发货吗", "3日发货吗", Date},
		{"english negation", "Why can I log in?", "Why can't I log in?", Negation},
		{"not", "Is this covered by the warranty", "Is this not covered by the warranty", Negation},
		{"never", "does it ever expire", "does it never expire", Negation},
		{"chinese 不", "为什么能退款", "为什么不能退款", Negation},
		{"chinese 没", "收到货了怎么办", "没收到货怎么办", Negation},
		{"chinese 未", "已发货订单怎么取消", "未发货订单怎么取消", Negation},
		{"chinese 非", "会员能用吗", "非会员能用吗", Negation},
		{"chinese 无法", "可以登录", "无法登录", Negation},
		{"changed quote", `What does "idempotent" mean?`, `What does "immutable" mean?`, Quote},
		{"book title", "《活着》好看吗", "《围城》好看吗", Quote},
		{"added quote", `how to use 'grep'`, "how to use grep", Quote},
		{"other product, capitalised", "How do I cancel Netflix?", "How do I cancel Spotify?", Entity},
		{"other product in chinese text", "iPhone怎么退货", "iPad怎么退货", Entity},
		{"other product, mixed case", "Does it work with macOS?", "Does it work with Windows?", Entity},
		{"name missing from one side", "How do I export data to Excel?", "how do i export data", Entity},
	})
}

func TestExtract(t *testing.T) {
	t.Parallel()
	tests := []struct {
		text string
		want Signature
	}{
		{"退货要几天？十五天内可以吗", Signature{Numbers: []string{"15"}}},
		{"二〇二四年三月五号下午", Signature{Numbers: []string{"2024", "3", "5"}, Dates: []string{"下午"}}},
		{"Ship 2,500 units by 3 pm on Friday", Signature{Numbers: []string{"2500", "3"}, Dates: []string{"3pm", "fri"}, Entities: []string{"friday"}}},
		{"I can't and won't", Signature{Negations: 2}},
		{"有没有不含糖的", Signature{Negations: 1}},
		{`Compare "A" and 『B』`, Signature{Quotes: []string{"a", "b"}, Entities: []string{"a", "b"}}},
		{"Does the Apple Watch work with Android", Signature{Entities: []string{"android", "apple", "watch"}}},
		{"version 1.2.0 vs 1.20", Signature{Numbers: []string{"1.2", "1.2.0"}}},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			t.Parallel()
			got := Extract(tt.text)
			if !slices.Equal(got.Numbers, tt.want.Numbers) || !slices.Equal(got.Dates, tt.want.Dates) ||
				got.Negations != tt.want.Negations || !slices.Equal(got.Quotes, tt.want.Quotes) ||
				!slices.Equal(got.Entities, tt.want.Entities) {
				t.Errorf("Extract(%q) =\n numbers %v dates %v negations %d quotes %q entities %v\nwant\n numbers %v dates %v negations %d quotes %q entities %v",
					tt.text, got.Numbers, got.Dates, got.Negations, got.Quotes, got.Entities,
					tt.want.Numbers, tt.want.Dates, tt.want.Negations, tt.want.Quotes, tt.want.Entities)
			}
		})
	}
}
