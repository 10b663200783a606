package cache

import (
	"regexp"
	"strings"
	"unicode/utf8"
)

// Built-in detection of volatile and personal questions, in English and Chinese. Marker
// lists (volatile_markers, personal_markers) match words; these rules read a little of the
// sentence's shape, which word lists cannot: "what time is it" is volatile and "what time
// do you open" is not; "did my payment go through" is about one person's records and "can
// I change my payment method" is a question about the product that happens to say "my".
//
// The rules run on normalised text (lower case, NFKC). RE2 runs in time linear in the
// input, so a hostile prompt cannot make them slow.

// volatileRules match questions whose answer changes by the minute: the time and date,
// weather, market prices and exchange rates, scores, events of this week, the status of a
// service, an order or a delivery, the news.
var volatileRules = compileRules(
	// Time and date.
	`what time	`+`\bwhat time is it\b`, `time|date	`+`\bwhat(?:'s| is) (?:the )?(?:time|date)(?: (?:now|today|right now))?$`,
	`day|date	`+`\bwhat(?:'s| is)? (?:the )?(?:day|date) (?:is )?(?:it|today)\b`, `what day	`+`\bwhat day is it\b`,
	`date	`+`\btoday'?s date\b`, `time|date	`+`\b(?:current|local) (?:time|date)\b`, `time	`+`\btime (?:is it )?(?:now|right now)\b`,
	`几点了`, `现在几点`, `几点钟了`, `今天几号`, `今天是几号`, `几月几号`, `今天星期几`, `今天周几`, `今天礼拜几`, `现在的时间`, `北京时间`,
	// Weather.
	`weather|forecast|raining|snowing|humidity|air quality	`+`\b(?:weather|forecast|raining|snowing|humidity|air quality)\b`, `will it	`+`\bwill it (?:rain|snow)\b`,
	`temperature	`+`\btemperature (?:outside|today|tonight|now|in)\b`,
	`天气`, `气温`, `下雨`, `下雪`, `降雨`, `台风`, `空气质量`, `雾霾`,
	// Market prices and exchange rates.
	`exchange rate	`+`\bexchange rates?\b`, `rate	`+`\b(?:fx|forex) rate\b`,
	`usd|eur|gbp|jpy|cny|rmb|hkd|cad|aud|chf|btc|eth|dollar|euro|pound|yen|yuan|bitcoin	`+`\b(?:usd|eur|gbp|jpy|cny|rmb|hkd|cad|aud|chf|btc|eth|dollars?|euros?|pounds?|yen|yuan|bitcoin)\s*(?:to|/|->|→|in|into|vs)\s*(?:usd|eur|gbp|jpy|cny|rmb|hkd|cad|aud|chf|btc|eth|dollars?|euros?|pounds?|yen|yuan|bitcoin)\b`,
	`price|value|quote|worth|trading	`+`\b(?:bitcoin|btc|ethereum|eth|dogecoin|crypto|cryptocurrency|gold|silver|oil|gasoline|petrol|stock|stocks|shares?|nasdaq|dow jones|s&p 500)(?:'s)? (?:price|prices|value|quote|worth|trading)\b`,
	`price|value|worth|quote	`+`\b(?:price|prices|value|worth|quote) of (?:a |an |one )?(?:bitcoin|btc|ethereum|eth|dogecoin|crypto|gold|silver|oil|gasoline|petrol|\w+ stock|\w+ shares)\b`,
	`how much is	`+`\bhow much is (?:a |one )?(?:bitcoin|btc|ethereum|eth|gold|silver|oil)\b`, `stock price	`+`\bstock price\b`, `share price	`+`\bshare price\b`, `market	`+`\bmarket (?:open|today|now)\b`,
	`汇率`, `股价`, `币价`, `金价`, `油价`, `行情`, `大盘`, `涨了吗`, `跌了吗`, `涨停`, `跌停`, `收盘`, `开盘价`,
	`比特币	`+`比特币(?:价格|多少钱|现在|今天|价|的价格|涨|跌)`, `以太坊	`+`以太坊(?:价格|多少钱|价)`, `美元|欧元|英镑|日元|港币|港元|人民币|韩元	`+`(?:美元|欧元|英镑|日元|港币|港元|人民币|韩元)(?:兑|对|换|等于|能换)`, `等于多少	`+`等于多少(?:人民币|美元|欧元|日元|港币)`,
	// Scores and results.
	`who won	`+`\bwho won\b`, `winning	`+`\bwho(?:'s| is) winning\b`, `score	`+`\b(?:live|final|current|latest) scores?\b`, `score	`+`\bscore of (?:the )?(?:\w+ )?(?:game|match)\b`,
	`score	`+`\bwhat(?:'s| is) the score\b`, `score|result	`+`\b(?:game|match) (?:score|result)s?\b`,
	`比分`, `谁赢了`, `赛果`, `比赛结果`, `战况`,
	// Events now and this week.
	`this	`+`\bthis (?:weekend|week|evening|afternoon|morning)\b`, `upcoming events	`+`\bupcoming events\b`, ` on 	`+`\bwhat(?:'s| is) on (?:this|tonight|today)\b`,
	`这周末`, `本周末`, `这个周末`, `这周`, `本周`, `近期活动`, `最近有什么活动`, `今晚`,
	// Status of a service.
	`is your|is the	`+`\bis (?:your|the) (?:\w+ )?(?:site|website|app|service|server|servers|api|platform|system|portal|page|network) (?:down|up|working|offline|online|out)\b`,
	`outage|status	`+`\b(?:outage|outages|service status|status page)\b`, `down	`+`\bis (?:it|everything|something) down\b`, `down	`+`\bdown (?:right )?now\b`,
	`now	`+`\b(?:not working|broken) (?:right )?now\b`, `are you	`+`\bare you (?:down|having (?:issues|problems))\b`,
	`挂了`, `崩了`, `宕机`, `打不开了`, `访问不了`, `上不去了`, `服务状态`, `故障了吗`, `是不是坏了`,
	// Status of an order, a delivery or a queue.
	`where	`+`\bwhere(?:'s| is) my (?:order|package|parcel|delivery|shipment|refund|driver|food)\b`,
	`my	`+`\b(?:has|did|have) my (?:\w+ )?(?:order|package|parcel|shipment|delivery) (?:been )?(?:ship|shipped|arrive|arrived|dispatched|delivered|left|go out|come)\b`,
	`when will my	`+`\bwhen will my (?:\w+ )?(?:order|package|parcel|shipment|delivery) (?:arrive|ship|come|be delivered)\b`,
	`of my	`+`\b(?:status|tracking) of my\b`, `status	`+`\bmy (?:order|package|parcel|shipment|delivery) status\b`, `how long is the	`+`\bhow long is the (?:queue|wait|line)\b`, `delay	`+`\bdelays? (?:on|at)\b`,
	`到哪了`, `到哪里了`, `到哪儿了`, `发货了吗`, `发货了没`, `物流信息`, `物流到`, `订单状态`, `快递到`, `什么时候到货`, `排队多久`, `延误`,
	// The news.
	`news|headlines|trending	`+`\b(?:news|headlines|trending)\b`, `新闻`, `头条`, `热搜`,
)

// personalRecords are the records of one person a question may ask about.
const personalRecordsEN = `(?:account|accounts|balance|points|credits?|order|orders|package|parcel|payment|payments|card|cards|subscription|plan|membership|refund|refunds|invoice|invoices|bill|bills|statement|transaction|transactions|transfer|claim|application|ticket|booking|reservation|limit|data|wallet|deposit|withdrawal|loan|score|salary|delivery|shipment|level|tier|status|coupons?|vouchers?|miles)`

const personalRecordsZH = `(?:余额|积分|订单|快递|包裹|退款|付款|支付|账户|账号|会员|订阅|账单|优惠券|额度|信用分|工资|话费|流量|套餐|物流|发票|保单|预约|工单|申请|理赔|交易|转账|提现|卡|贷款|扣款|扣费|等级|钱包|押金|红包)`

// personalRules match questions about the asker's own records: possessive records (my
// balance, 我的积分) and first-person states (how many points do I have, 我还有多少).
var personalRules = compileRules(
	`my	`+`\bmy (?:\w+ ){0,2}?`+personalRecordsEN+`\b`,
	`how much|how many	`+`\bhow (?:much|many) (?:\w+ ){0,3}?(?:do|did) i (?:have|owe|spend|spent|earn|earned|pay|paid|use|used|get)(?: left| remaining| now)?$`,
	`owe	`+`\b(?:do|did) i (?:still )?owe\b`, `have left	`+`\b(?:do )?i have left\b`, `am i	`+`\bam i (?:on|subscribed|eligible|verified|blocked|banned|enrolled|registered|a member)\b`,
	`was i	`+`\bwas i (?:charged|billed|refunded|debited)\b`, `have i	`+`\bhave i (?:been (?:charged|billed|refunded)|paid|used)\b`,
	`我的	`+`我的[^，。？！,?!\s]{0,4}?`+personalRecordsZH, `多少	`+`我(?:还有|还剩|剩|剩下|有)多少`, `我	`+`我(?:这个月|本月|今年|现在)(?:要|还|的|是)`,
	`多少	`+`我.{0,6}(?:要还|欠)多少`, `我	`+`我(?:上一笔|上一次|上次|最近一笔|最近一次|最近的)[^，。？！,?!\s]{0,3}?`+personalRecordsZH,
)

// generalFrames are how-to and policy questions: asked by anyone, answered for everyone,
// even when they say "my" (how do I cancel my subscription, 怎么修改我的地址).
var generalFrames = compileRules(
	`how|can i|could i|may i|is it possible|where|is there a way|what happens|do you|does your|steps to|i want to|i'd like|i would like|help me	`+`\b(?:how (?:do|can|should|would|could) i|how to|can i|could i|may i|is it possible|where (?:can|do) i|is there a way|how long|how soon|how often|what happens (?:if|when)|do you|does your|steps to|i want to|i'd like to|i would like to|help me)\b`,
	`怎么|如何|怎样|在哪|哪里可以|去哪	`+`(?:怎么|如何|怎样|在哪里?|哪里可以|去哪)(?:才能|可以|能)?(?:修改|更改|改|取消|删除|设置|开通|申请|绑定|解绑|查看|查询|查|退|注销|关闭|升级|降级|更换|换|兑换|使用|用|暂停|恢复|跟踪|追踪|找到|领取|充值|提现|续费|退订|开|下载|导出|打印|添加)`,
	`可以|能	`+`(?:可以|能|能不能|可不可以|是否可以|能否)(?:修改|更改|改|取消|删除|更换|换|暂停|注销|退|转让|合并|延期)`,
	`一般	`+`一般(?:多久|要多久|几天)`, `多久	`+`多久(?:能|可以|会)?到账`,
)

// rules is a list of patterns prepared for speed. A pattern is a plain word, found with
// strings.Contains, or "triggers<TAB>expression": the regular expression runs only on text
// that contains one of its |-separated trigger words, which every match contains. Most
// questions contain no trigger, so they cost a few substring searches, not a regular
// expression per rule.
type rules struct {
	literals []needle
	gated    []gatedRule
}

type gatedRule struct {
	triggers []needle
	re       filteredRegexp
}

// byScript splits rules in two: those that can match ASCII text, and those that need
// other characters (Chinese words), which text without such characters skips.
type byScript struct{ ascii, other rules }

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func compileRules(patterns ...string) byScript {
	var b byScript
	for _, p := range patterns {
		r := &b.ascii
		if !isASCII(strings.Split(p, "\t")[0]) {
			r = &b.other
		}
		triggers, expr, gated := strings.Cut(p, "\t")
		if !gated {
			if regexp.QuoteMeta(p) != p {
				panic("cache: classifier rule without triggers: " + p) //nolint:forbidigo // compiled-in; the tests build every rule
			}
			r.literals = append(r.literals, newNeedle(p))
			continue
		}
		r.gated = append(r.gated, gatedRule{newNeedles(strings.Split(triggers, "|")), compileFiltered(expr)})
	}
	return b
}

// matchesAny reports whether a rule of b matches text. stats, when not nil, are text's:
// words they rule out are not searched.
func matchesAny(text string, stats *textStats, b byScript) bool {
	return b.ascii.match(text, stats) || (!isASCII(text) && b.other.match(text, stats))
}

func (r rules) match(text string, stats *textStats) bool {
	for i := range r.literals {
		if l := &r.literals[i]; stats.mayContain(l) && strings.Contains(text, l.word) {
			return true
		}
	}
	for gi := range r.gated {
		g := &r.gated[gi]
		for i := range g.triggers {
			if t := &g.triggers[i]; stats.mayContain(t) && strings.Contains(text, t.word) {
				if g.re.matchString(text, stats) {
					return true
				}
				break
			}
		}
	}
	return false
}

// classifierText prepares normalised text for the rules: typographic apostrophes become
// ASCII ones, so "what’s" reads as "what's".
func classifierText(normalized string) string {
	return strings.ReplaceAll(normalized, "’", "'")
}

// personalQuestion reports whether text (normalised, through classifierText) asks about
// the asker's own records, rather than how something works for everyone. stats, when not
// nil, are text's.
func personalQuestion(text string, stats *textStats) bool {
	return matchesAny(text, stats, personalRules) && !matchesAny(text, stats, generalFrames)
}
