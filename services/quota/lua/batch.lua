-- batch: run a list of operations in order, each with its own reply, in one call. One
-- call per batch instead of one script per operation saves, per operation, the call's
-- setup (the KEYS and ARGV tables, the script's helpers when run as EVAL), Redis TIME
-- and the reply's framing.
--
-- keys: every operation's keys, in order. args: per operation its name (r reserve,
-- s settle, a adjust, t retry), its number of keys, its number of arguments, then its
-- arguments, which are what the operation's file documents as ARGV.
--
-- Returns one reply per operation: what the operation returns, or an error reply when
-- it failed. A failed operation does not stop the others; like a failed script, it
-- keeps the writes it made before failing.
local ops = {r = op_reserve, s = op_settle, a = op_adjust, t = op_retry}

local function batch(keys, args)
  now_s, now_ns = nil, nil
  local out = {}
  local k, i, n = 1, 1, #args
  while i <= n do
    local op, nk, na = ops[args[i]], tonumber(args[i + 1]), tonumber(args[i + 2])
    if not op or not nk or not na then
      return redis.error_reply('ERR quota batch: malformed operation at argument ' .. i)
    end
    local ok, res = pcall(op, {unpack(keys, k, k + nk - 1)}, {unpack(args, i + 3, i + 2 + na)})
    if ok then
      out[#out + 1] = res
    elseif type(res) == 'table' and res.err then
      out[#out + 1] = res
    elseif type(res) == 'string' and string.find(res, '^%u+ ') then
      -- A Redis error (WRONGTYPE ..., OOM ...) raised by redis.call: as it was.
      out[#out + 1] = {err = res}
    else
      out[#out + 1] = {err = 'ERR quota: ' .. tostring(res)}
    end
    k, i = k + nk, i + 3 + na
  end
  return out
end
