package nearmiss

import "testing"

// TestCompareMeaning covers the details a lexical similarity does not see: signs and
// operators, currencies and units, emoji, directions and opposites.
func TestCompareMeaning(t *testing.T) {
	t.Parallel()
	runCompareCases(t, []compareCase{
		// Signs and operators.
		{"negative number", "What is -5 squared?", "What is 5 squared?", Number},
		{"negative temperature", "Is -20 degrees dangerous for a car battery?", "Is 20 degrees dangerous for a car battery?", Number},
		{"零下", "零下20度要穿什么", "20度要穿什么", Number},
		{"负数", "负3的绝对值是多少", "3的绝对值是多少", Number},
		{"division vs multiplication", "What is 200 / 15?", "What is 200 * 15?", Operator},
		{"plus vs minus", "2+3等于几", "2-3等于几", Operator},
		{"times sign", "what is 6 × 7", "what is 6 + 7", Operator},
		{"operands swapped", "what is 10 - 3", "what is 3 - 10", Operator},
		{"chinese operator words", "2加3等于多少", "2减3等于多少", Operator},
		{"english operator words", "what is 10 plus 4", "what is 10 minus 4", Operator},
		{"less than vs greater than", "is x < 5 allowed", "is x > 5 allowed", Operator},
		{"same expression, spaced differently", "What is 200 / 15?", "what is 200/15", ""},
		{"hyphenated words are not operators", "Is there a 5-year warranty on e-bikes?", "is there a 5-year warranty on e-bikes", ""},
		{"range is kept as written", "Delivery in 2-3 days?", "delivery in 2-3 days", ""},
		// Currencies and units.
		{"dollar vs euro sign", "Can I withdraw $500 at the airport?", "Can I withdraw €500 at the airport?", Unit},
		{"yuan vs dollars", "500元能买什么", "500美元能买什么", Unit},
		{"percent vs plain", "Is a 50% deposit required?", "Is a 50 deposit required?", Unit},
		{"km vs miles", "How long does it take to run 10 km?", "How long does it take to run 10 miles?", Unit},
		{"kg vs lb", "Is 5 kg over the carry-on limit?", "Is 5 lb over the carry-on limit?", Unit},
		{"days vs weeks", "Can I return it within 3 days?", "Can I return it within 3 weeks?", Unit},
		{"chinese days vs months", "3天内可以退吗", "3个月内可以退吗", Unit},
		{"celsius vs fahrenheit", "Is 30°C hot?", "Is 30°F hot?", Unit},
		{"mg vs g", "Is 500 mg of aspirin safe?", "Is 500 g of aspirin safe?", Unit},
		{"same currency, other spelling", "Can I withdraw $500?", "can i withdraw 500 dollars", ""},
		{"same chinese currency", "500元能买什么", "500块能买什么", ""},
		{"rice is not a metre", "大米怎么煮", "大米如何煮", ""},
		// Emoji.
		{"thumbs up vs down", "Customer replied 👍 to the refund offer, what next?", "Customer replied 👎 to the refund offer, what next?", Emoji},
		{"smile vs cry", "回复😊是什么意思", "回复😭是什么意思", Emoji},
		{"skin tone does not matter", "what does 👍🏽 mean", "what does 👍 mean", ""},
		{"same polarity", "reply with ✅ or ❌?", "reply with ✔ or ✖?", ""},
		// Directions and roles.
		{"from/to reversed", "How long does a transfer from my savings to my checking take?", "How long does a transfer from my checking to my savings take?", Direction},
		{"to/from reversed", "transfer money to checking from savings", "transfer money from checking to savings", Direction},
		{"reversed without from", "How long to move money from savings to checking?", "How long to move money checking to savings?", Direction},
		{"currency pair", "convert usd to cny", "convert cny to usd", Direction},
		{"arrow", "USD→CNY rate", "CNY→USD rate", Direction},
		{"从到", "从储蓄账户转到支票账户要多久", "从支票账户转到储蓄账户要多久", Direction},
		{"兑", "美元兑人民币怎么算", "人民币兑美元怎么算", Direction},
		{"对 without a direction word", "美元对人民币汇率怎么查", "人民币对美元汇率怎么查", Direction},
		{"比", "苹果比香蕉贵吗", "香蕉比苹果贵吗", Direction},
		{"than", "Is the Pro plan cheaper than the Team plan?", "Is the Team plan cheaper than the Pro plan?", Direction},
		{"same direction", "How long does a transfer from my savings to my checking take?", "how long does a transfer from my savings to my checking take", ""},
		{"比较 is not a comparison", "比较一下两个套餐", "比较两个套餐", ""},
		// Opposites.
		{"maximum vs minimum", "What is the maximum dose of ibuprofen for adults?", "What is the minimum dose of ibuprofen for adults?", Opposite},
		{"儿童 vs 成人", "儿童阿司匹林的剂量是多少", "成人阿司匹林的剂量是多少", Opposite},
		{"上班 vs 下班", "上班路上受伤算工伤吗", "下班路上受伤算工伤吗", Opposite},
		{"退货 vs 换货", "我在你们店里买的衣服不合身，收到七天以内还能申请退货吗，需要自己付运费吗", "我在你们店里买的衣服不合身，收到七天以内还能申请换货吗，需要自己付运费吗", Opposite},
		{"门店 vs 网店", "门店买的东西可以退吗", "网店买的东西可以退吗", Opposite},
		{"before vs after", "Should I take it before meals?", "Should I take it after meals?", Opposite},
		{"increase vs decrease", "How do I increase my credit limit?", "How do I decrease my credit limit?", Opposite},
		{"inflected", "Why was my limit increased?", "Why was my limit decreased?", Opposite},
		{"log in vs log out", "I can't log in on my phone", "I can't log out on my phone", Opposite},
		{"upload vs download", "上传文件失败怎么办", "下载文件失败怎么办", Opposite},
		{"one side only is no contradiction", "What is the maximum dose?", "What is the dose?", ""},
		{"both sides on both", "退货和换货有什么区别", "换货和退货有什么区别", ""},
		{"mining is not min", "Is mining allowed?", "is mining allowed", ""},
	})
}

func TestParseOpposites(t *testing.T) {
	t.Parallel()
	if _, err := parseOpposites(oppositesText); err != nil {
		t.Fatalf("opposites.txt: %v", err)
	}
	if len(sideCounts) < 100 {
		t.Errorf("opposites.txt has %d axes; want a substantial lexicon", len(sideCounts))
	}
	for _, bad := range []string{"only one side", "a, b | b", "大 | 小", "a | | b"} {
		if _, err := parseOpposites(bad); err == nil {
			t.Errorf("parseOpposites(%q) = nil error, want one", bad)
		}
	}
}
