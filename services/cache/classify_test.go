package cache

import "testing"

// TestPromptSkipClassifies runs the default policy on ordinary phrasings of volatile and
// personal questions, and on the general questions that look like them.
func TestPromptSkipClassifies(t *testing.T) {
	t.Parallel()
	p := compilePolicy(DefaultConfig().DefaultPolicy, defaultThresholds(EmbedderLexical))
	volatile := []string{
		"What time is it?", "what's the time", "What’s the date?", "What is the date today?", "What day is it?",
		"What day is it today?", "today's date please", "current time in Tokyo",
		"How much is 1 USD in CNY?", "USD to CNY", "What is the dollar to yuan rate?", "euro exchange rate",
		"What is the price of bitcoin?", "bitcoin price", "How much is bitcoin worth?", "What's Apple's stock price?",
		"gold price per ounce", "Is your website down?", "Is the app down?", "Is the API working?", "Is there an outage?",
		"is everything down", "What's the weather in Paris?", "Will it rain tomorrow?", "Will it snow in Denver?",
		"What events are on this weekend?", "Who won the game?", "What's the score of the Lakers game?", "live scores",
		"Where is my order?", "Where's my package", "Has my order shipped?", "When will my parcel arrive?",
		"Any news about the merger?", "How long is the queue?",
		"现在几点了", "几点了", "今天几号", "今天星期几", "几月几号", "比特币价格", "比特币现在多少钱", "人民币汇率", "美元兑人民币",
		"1美元等于多少人民币", "这周末有什么活动", "本周末商场有活动吗", "你们网站是不是挂了", "App崩了吗", "服务器宕机了吗",
		"上海天气怎么样", "会下雨吗", "比分多少", "昨晚谁赢了", "我的订单到哪了", "快递到哪了", "发货了吗", "金价多少", "大盘跌了吗",
		"最新新闻", "热搜是什么",
	}
	personal := []string{
		"What is my account balance?", "What is my balance?", "How much money is in my account?", "How many points do I have?",
		"How many reward points do I have left?", "Did my payment go through?", "Was my card charged twice?",
		"Has my refund arrived?", "When will I get my refund?", "What's my order number?", "When does my subscription renew?",
		"Is my subscription still active?", "Why was my payment declined?", "What plan am I on?", "How much do I owe?",
		"What is my credit limit?", "When is my next bill due?", "Show me my last invoice", "What's my membership level?",
		"Is my account verified?", "Why is my account locked?", "Has my claim been approved?", "Was I charged for the trial?",
		"Am I eligible for the upgrade?", "Have I been billed this month?",
		"我的账户余额是多少", "我还有多少积分", "我的积分还剩多少", "我的退款到账了吗", "我的付款成功了吗", "我的卡被扣了两次钱",
		"我的订阅什么时候续费", "我的会员什么时候到期", "我这个月要还多少钱", "我的信用额度是多少", "我的流量还剩多少",
		"为什么我的付款被拒了", "查一下我的话费余额", "我还剩多少余额", "我的理赔通过了吗", "我的优惠券还有几张",
	}
	general := []string{
		"Can I change my delivery address?", "How long do refunds take?", "How do I cancel my subscription?",
		"How do I check my balance?", "Can I change my payment method?", "How do I delete my account?",
		"How do I update my billing address?", "How long does shipping take?", "What payment methods do you accept?",
		"How do I redeem my points?", "Can I pause my subscription?", "What is your refund policy?",
		"How do I reset my password?", "Do points expire?", "How do I track my order?", "What time do you open?",
		"What is the date format in the export?", "Do I have to pay for returns?", "How do I add a card to my wallet?",
		"Can I pay with bitcoin?", "How do I set up my account?", "Is there a fee for international transfers?",
		"Where can I see my invoices?", "How can I upgrade my plan?", "What happens if my payment fails?",
		"How is the exchange fee calculated?",
		"可以修改收货地址吗", "退款一般多久到账", "怎么取消订阅", "怎么查看余额", "可以更换支付方式吗", "怎么注销账号",
		"怎么修改账单地址", "发货要多久", "支持哪些支付方式", "积分怎么兑换", "订阅可以暂停吗", "退款政策是什么",
		"密码怎么重置", "积分会过期吗", "怎么查物流", "我的地址可以改吗", "怎么修改我的手机绑定", "如何查看我的订单",
		"会员有什么权益", "优惠券怎么用",
	}
	for _, tt := range []struct {
		want      SkipReason
		questions []string
	}{{SkipVolatilePrompt, volatile}, {SkipPersonalPrompt, personal}, {"", general}} {
		for _, q := range tt.questions {
			t.Run(q, func(t *testing.T) {
				t.Parallel()
				if got := p.promptSkip(basePrompt(q), normalizeText(q)); got != tt.want {
					t.Errorf("promptSkip(%q) = %q, want %q", q, got, tt.want)
				}
			})
		}
	}
}

// TestDetectionCanBeTurnedOff checks the two switches: with detection off only the
// markers decide.
func TestDetectionCanBeTurnedOff(t *testing.T) {
	t.Parallel()
	pol := DefaultConfig().DefaultPolicy
	pol.DetectVolatile, pol.DetectPersonal = false, false
	p := compilePolicy(pol, defaultThresholds(EmbedderLexical))
	for _, q := range []string{"What time is it?", "Did my payment go through?", "我还有多少积分"} {
		if got := p.promptSkip(basePrompt(q), normalizeText(q)); got != "" {
			t.Errorf("promptSkip(%q) with detection off = %q, want none", q, got)
		}
	}
}

// TestDetectionConfig checks that a scenario can turn each detection off in YAML and that
// the others keep the default.
func TestDetectionConfig(t *testing.T) {
	t.Parallel()
	cfg, err := decodeStrict(`
scenarios:
  clock:
    detect_volatile: false
  ledger:
    detect_personal: false
`)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	tests := []struct {
		scenario, question string
		want               SkipReason
	}{
		{"clock", "What time is it?", ""},
		{"clock", "What is my account balance?", SkipPersonalPrompt},
		{"ledger", "What is my account balance?", ""},
		{"ledger", "What time is it?", SkipVolatilePrompt},
		{"other", "What time is it?", SkipVolatilePrompt},
	}
	for _, tt := range tests {
		p := compilePolicy(cfg.DefaultPolicy.with(cfg.Scenarios[tt.scenario]), defaultThresholds(EmbedderLexical))
		if got := p.promptSkip(basePrompt(tt.question), normalizeText(tt.question)); got != tt.want {
			t.Errorf("scenario %s: promptSkip(%q) = %q, want %q", tt.scenario, tt.question, got, tt.want)
		}
	}
}
