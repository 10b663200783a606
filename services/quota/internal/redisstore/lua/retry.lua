-- retry: the mesh-wide retry budget (retrybudget.go has the rule and the sliding window
-- estimate). Scopes are "o" (overall), "k:<key id>" and "t:<tenant>" (the tenant's share,
-- whose requests stay 0: only its retries count); each keeps the current fixed window's
-- index and counts and the previous window's counts in one hash.
--
-- K1 the retry budget's hash.
-- ARGV: now s, now ns, window (whole s), ratio, floor, format_only_above, format 0|1,
-- acquire 0|1, key ('' for none), requests to add overall, requests to add for the key,
-- tenant ('' for none), tenant share.
--
-- Returns {granted 0|1, refusing scope (0 none, 1 overall, 2 key, 3 tenant), requests,
-- retries} with the estimates as strings, rounded to six decimals.
local K = K1
local s, ns = clock(ARGV[1], ARGV[2])
local ws = ARGV[3]
local ratio, floor, fmt = ARGV[4], ARGV[5], ARGV[6]
local format, acquire = ARGV[7] == 1, ARGV[8] == 1
local win, off = idiv(s, ws)
local elapsed = (off * E9 + ns) / (ws * E9)

local scopes = {{'o', ARGV[10]}}
if ARGV[9] ~= '' then
  scopes[#scopes + 1] = {'k:' .. ARGV[9], ARGV[11]}
end
local tenant = 0
if ARGV[12] ~= '' then
  scopes[#scopes + 1] = {'t:' .. ARGV[12], 0}
  tenant = #scopes
end
local share = ARGV[13]
local counts = {}
for i, sc in ipairs(scopes) do
  local p = sc[1]
  local v = redis.call('HMGET', K, p .. '|w', p .. '|q', p .. '|r', p .. '|pq', p .. '|pr')
  local w = tonumber(v[1] or -1)
  local q, r, pq, pr = tonumber(v[2] or 0), tonumber(v[3] or 0), tonumber(v[4] or 0), tonumber(v[5] or 0)
  if w == win - 1 then
    pq, pr, q, r = q, r, 0, 0
  elseif w ~= win then
    q, r, pq, pr = 0, 0, 0, 0
  end
  counts[i] = {q + sc[2], r, pq, pr}
end

local function allow(q, r)
  if r < floor then
    return true
  end
  if r / math.max(q, 1) > fmt and not format then
    return false
  end
  return r + 1 <= ratio * q
end

local granted, refusing = 1, 0
local eq, er = 0, 0
for i, c in ipairs(counts) do
  local q, r = c[1] + c[3] * (1 - elapsed), c[2] + c[4] * (1 - elapsed)
  if i == 1 then
    eq, er = q, r
  end
  if i == tenant then
    -- The share is of what the whole budget allows at the overall estimate.
    if acquire and granted == 1 and not (r + 1 <= share * math.max(floor, ratio * eq)) then
      granted, refusing, er = 0, 3, r
    end
  elseif acquire and granted == 1 and not allow(q, r) then
    granted, refusing, eq, er = 0, i, q, r
  end
end
if acquire and granted == 1 then
  er = er + 1
  for _, c in ipairs(counts) do
    c[2] = c[2] + 1
  end
end
for i, sc in ipairs(scopes) do
  local p, c = sc[1], counts[i]
  redis.call('HSET', K, p .. '|w', string.format('%d', win), p .. '|q', c[1], p .. '|r', c[2], p .. '|pq', c[3], p .. '|pr', c[4])
end
redis.call('PEXPIRE', K, (2 * ws + 1) * 1000)
if not acquire then
  granted = 0
end
return {granted, refusing, string.format('%.6f', eq), string.format('%.6f', er)}
