function gen_cdna_vectors(matlab_tc_dir, data_file, model, informat, out_file)
% GEN_CDNA_VECTORS  Cross-check of tests/data/cdna/ (MMA-Sim's outputs, tools/gen_cdna_vectors.py)
% against the second published model of AMD's matrix cores: Khattak and Mikaitis's MATLAB models
% (arXiv 2512.07004; github.com/north-numerical-computing/MATLAB-tensor-core, BSD 2-Clause).
% Runs under GNU Octave (Debian's `octave`); fetches nothing.
%
%   git -C MATLAB-tensor-core checkout b12b5a700957655375a1b0c1d0c26e76065da015
%   git -C MATLAB-tensor-core show b4bf135:models/MI300MC.m > MI300MC.m   % deleted at b12b5a7,
%                                                                        % which MI300XMC.m calls
%   octave --no-gui -q --eval "addpath('tools'); addpath('.'); gen_cdna_vectors('MATLAB-tensor-core', ...
%       'tests/data/cdna/cdna3_f32_16x16x16_f16.txt', 'MI300XMC', 'fp16', 'out.txt')"
%
% model/informat per file: cdna2 f16 and bf16_1k: MI210MC with 'fp16' / 'bf16'; cdna3: MI300XMC with
% 'fp16', 'bf16', 'xf32', 'fp8' (e4m3fnuz), 'bf8' (e5m2fnuz). MI100MC needs MATLAB's string(), which
% Octave lacks. Octave also lacks fma(); the models call it as fma(x, 1, y) (a float32 addition)
% and this file supplies that if missing. Prints how many lines agree with the file's d (a NaN as
% any NaN); out_file gets one line per vector: the MATLAB result's float32 bits, MMA-Sim's, in hex
% ("ERR" where the model raised an error).
  addpath(fullfile(matlab_tc_dir, 'models'));
  addpath(fullfile(matlab_tc_dir, 'models', 'tools'));
  if ~exist('fma')
    shim = tempname(); mkdir(shim);
    fid = fopen(fullfile(shim, 'fma.m'), 'w');
    fprintf(fid, 'function r = fma(a, b, c)\n  r = single(double(a) .* double(b) + double(c));\nend\n');
    fclose(fid); addpath(shim);
  end
  switch informat
    case {'fp16', 'bf16'}, digits = 4;
    case 'xf32', digits = 8;
    otherwise, digits = 2;
  end
  lines = strsplit(fileread(data_file), "\n");
  fid = fopen(out_file, 'w');
  n = 0; agree = 0; errors = 0;
  for i = 1:numel(lines)
    l = strtrim(lines{i});
    if isempty(l) || l(1) == '#', continue; end
    f = strsplit(l, ' ');
    c = bits_to_single(hex2dec(f{2}));
    a = decode_all(f{3}, digits, informat);
    b = decode_all(f{4}, digits, informat);
    d = uint32(hex2dec(f{5}));
    n = n + 1;
    try
      evalc('D = feval(model, 1, a, b(:), 1, double(c), informat);');
      got = typecast(single(D), 'uint32');
      fprintf(fid, '%08x %08x\n', got, d);
      if isnan(single(D)) || isnan(typecast(d, 'single'))
        agree = agree + (isnan(single(D)) && isnan(typecast(d, 'single')));
      else
        agree = agree + (got == d);
      end
    catch
      fprintf(fid, 'ERR %08x\n', d);
      errors = errors + 1;
    end
  end
  fclose(fid);
  printf('%s: %s (%s): %d/%d agree with MMA-Sim, %d errors\n', data_file, model, informat, agree, n, errors);
end

function x = bits_to_single(u)
  x = typecast(uint32(u), 'single');
end

function v = decode_all(hex, digits, informat)
  k = numel(hex) / digits;
  v = zeros(1, k);
  for j = 1:k
    v(j) = decode(hex2dec(hex((j - 1) * digits + 1 : j * digits)), informat);
  end
end

function v = decode(code, informat)
  % The value of an operand code: f16, bf16, xf32 (a float32 word truncated to tf32, as MMA-Sim
  % reads it), fp8 = e4m3fnuz, bf8 = e5m2fnuz (bias 8 / 16, 0x80 the NaN, no inf).
  switch informat
    case 'xf32', v = double(bits_to_single(bitand(code, hex2dec('FFFFE000')))); return;
    case 'bf16', v = double(bits_to_single(code * 65536)); return;
    case 'fp16', e = 5; m = 10; bias = 15; w = 16; fnuz = false;
    case 'fp8', e = 4; m = 3; bias = 8; w = 8; fnuz = true;
    case 'bf8', e = 5; m = 2; bias = 16; w = 8; fnuz = true;
  end
  if fnuz && code == 128, v = NaN; return; end
  s = 1 - 2 * bitshift(code, -(w - 1));
  field = bitand(bitshift(code, -m), 2^e - 1);
  mant = bitand(code, 2^m - 1);
  if ~fnuz && field == 2^e - 1
    if mant == 0, v = s * Inf; else, v = NaN; end
  elseif field == 0
    v = s * mant * 2^(1 - bias - m);
  else
    v = s * (1 + mant / 2^m) * 2^(field - bias);
  end
end
